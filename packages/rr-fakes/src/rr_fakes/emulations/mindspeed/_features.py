"""MindSpeed's features that matter for routing replay, per MindSpeed line, as each really
patches (``mindspeed/features_manager``, read on 26.1.0_core_r0.12.1 = "0.12", core_r0.16.0 =
"0.16", core_r0.17.0 = "0.17", core_r0.18.0 = "0.18").

A feature applies when ``optimization_level <= args.optimization_level`` and its flag is set, or
always when its level is 0 (``MindSpeedFeature.is_need_apply``). Each registers its command-line
flags on MindSpeed's parser (``register_args``): the global arguments are that parser's answer.

- requirements (level 0, pre-patches, 0.12 / 0.16 only): see
  :mod:`rr_fakes.emulations.mindspeed._requirements`; on 0.17 / 0.18 MindSpeed registers no
  pre-patch (the MegatronAdaptor imported by ``mindspeed/__init__.py`` covers them).
- config basic (level 0; ``megatron_basic`` on 0.12 / 0.16, ``npu_enhancement`` on 0.17 / 0.18,
  which registers with ``force_patch=True``): ``TransformerConfig.__init__`` and
  ``__post_init__`` wrappers on every line, ``__init_subclass__`` on 0.12 / 0.16,
  ``MLATransformerConfig.__init__`` on 0.12, 0.16, 0.18.
- moe_tp_extend_ep (level 2, every line): ``register_patches`` first imports MindSpeed's MoE
  adaptor, whose package imports ``megatron.core.transformer.moe.legacy_a2a_token_dispatcher``
  on 0.17 / 0.18, a module those megatron-core releases no longer have: with the flag set the
  adaptor's import raises ModuleNotFoundError there. Then, with
  ``moe_token_dispatcher_type == 'alltoall_seq'``, it replaces ``TopKRouter.routing`` (see
  :mod:`rr_fakes.emulations.mindspeed._routing`) and, unless ``moe_alltoall_overlap_comm``,
  ``MoELayer``. Its validation needs ``num_experts`` (a training argument, not a config field),
  ``moe_permutation_async_comm`` with ``moe_grouped_gemm`` and no capacity factor.
- moe_alltoall_overlap_comm (level 2): only its flag is emulated.
- fix_router: 0.12 level 0, registered when ``fix_router`` **or** ``moe_expert_capacity_factor``
  is set; 0.17 / 0.18 level 2, when ``fix_router`` is set; absent on 0.16. It replaces
  ``moe_utils.topk_softmax_with_capacity`` (on 0.17 / 0.18 Megatron's moe_utils has no such
  name any more, so the replacement lands on an attribute nothing calls). Its validation
  refuses ``fix_router`` with ``expert_model_parallel_size <= 1``.
"""

from __future__ import annotations

import argparse
import importlib
from argparse import ArgumentParser, Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rr_fakes.emulations.mindspeed._requirements import (
    register_pre_patches,
    register_te_basic_pre_patches,
)
from rr_fakes.emulations.mindspeed._routing import (
    make_routing_tp_extend_ep,
    make_topk_softmax_with_capacity,
    make_tp_extend_ep_moe_layer,
)

LINES = ("0.12", "0.16", "0.17", "0.18")
PRE_PATCH_LINES = ("0.12", "0.16")  # where RequirementsBasicFeature registers the pre-patches


@dataclass(frozen=True)
class Targets:
    """The modules MindSpeed patches (Megatron's by default; stand-ins in torch-only tests)."""

    transformer_config: str = "megatron.core.transformer.transformer_config"
    router: str = "megatron.core.transformer.moe.router"
    moe_utils: str = "megatron.core.transformer.moe.moe_utils"
    moe_layer: str = "megatron.core.transformer.moe.moe_layer"
    #: gather_from_sequence_parallel_region and _split_along_first_dim
    tensor_parallel: str = "megatron.core.tensor_parallel.mappings"
    #: what MindSpeed's MoE package imports on 0.17 / 0.18 (gone from those releases)
    legacy_dispatcher: str = "megatron.core.transformer.moe.legacy_a2a_token_dispatcher"


class Feature:
    """``MindSpeedFeature``: a name (its flag), an optimisation level, its parser flags."""

    def __init__(self, name: str, optimization_level: int = 2) -> None:
        self.feature_name = name.lower().strip().replace("-", "_")
        self.optimization_level = optimization_level
        self.default_patches = optimization_level == 0

    def is_need_apply(self, args: Namespace) -> bool:
        level_ok = self.optimization_level <= args.optimization_level
        return bool(level_ok and getattr(args, self.feature_name, None)) or self.default_patches

    def register_args(self, parser: ArgumentParser) -> None:
        pass

    def pre_validate_args(self, args: Any) -> None:
        pass

    def post_validate_args(self, args: Any) -> None:
        pass

    def validate_args(self, args: Any) -> None:
        pass

    def pre_register_patches(self, pm: Any, args: Namespace) -> None:
        pass

    def register_patches(self, pm: Any, args: Namespace) -> None:
        pass


class RequirementsFeature(Feature):
    """``RequirementsBasicFeature`` (0.12 / 0.16): the pre-patches."""

    def __init__(self, line: str, enabled: bool = True) -> None:
        super().__init__("requirements-basic", 0)
        self.line, self.enabled = line, enabled

    def register_args(self, parser: ArgumentParser) -> None:
        group = parser.add_argument_group(title=self.feature_name)
        _basic_args(group)

    def pre_register_patches(self, pm: Any, args: Namespace) -> None:
        if self.enabled:  # off: a process that imported Megatron already (too late for them)
            register_pre_patches(pm, self.line)


def _basic_args(group: Any) -> None:
    group.add_argument(
        "--optimizer-selection",
        type=str,
        default="fused_adamw",
        choices=["fused_adamw", "fused_torch_adamw", "fused_ema_adamw"],
    )
    group.add_argument("--optimization-level", type=int, choices=[0, 1, 2], default=2)


class ConfigFeature(Feature):
    """``MegatronBasicFeature`` (0.12 / 0.16) or ``NpuEnhancementFeature`` (0.17 / 0.18, which
    also took over the basic flags and registers its config patches with ``force_patch``)."""

    def __init__(self, line: str, targets: Targets, patches: tuple[Any, Any, Any]) -> None:
        super().__init__("megatron-basic" if line in PRE_PATCH_LINES else "npu-enhancement", 0)
        self.line, self.targets, self.patches = line, targets, patches

    def register_args(self, parser: ArgumentParser) -> None:
        group = parser.add_argument_group(title=self.feature_name)
        if self.line not in PRE_PATCH_LINES:
            _basic_args(group)
        group.add_argument("--use-fused-rmsnorm", action="store_true")
        group.add_argument("--use-fused-swiglu", action="store_true")

    def register_patches(self, pm: Any, args: Namespace) -> None:
        init, post_init, init_subclass = self.patches
        tc = self.targets.transformer_config
        force = self.line not in PRE_PATCH_LINES
        register = pm.register_patch
        register(f"{tc}.TransformerConfig.__init__", init, force_patch=force)
        if not force:
            register(f"{tc}.TransformerConfig.__init_subclass__", classmethod(init_subclass))
        register(f"{tc}.TransformerConfig.__post_init__", post_init, force_patch=force)
        if self.line != "0.17":
            register(f"{tc}.MLATransformerConfig.__init__", init, force_patch=force)


class TransformerEngineBasicFeature(Feature):
    """``TransformerEngineBasicFeature`` (0.12 / 0.16): its pre-patch only."""

    def __init__(self, line: str, enabled: bool = True) -> None:
        super().__init__("transformer-engine-basic", 0)
        self.line, self.enabled = line, enabled

    def pre_register_patches(self, pm: Any, args: Namespace) -> None:
        if self.enabled:
            register_te_basic_pre_patches(pm, self.line)


class TpExtendEpFeature(Feature):
    def __init__(self, line: str, targets: Targets, calls: list[str]) -> None:
        super().__init__("moe-tp-extend-ep", 2)
        self.line, self.targets, self.calls = line, targets, calls

    def register_args(self, parser: ArgumentParser) -> None:
        group = parser.add_argument_group(title=self.feature_name)
        group.add_argument("--moe-tp-extend-ep", action="store_true")
        group.add_argument("--moe-permutation-async-comm", action="store_true")

    def validate_args(self, args: Any) -> None:
        if not args.moe_tp_extend_ep:
            return
        if args.num_experts % (args.tensor_model_parallel_size * args.expert_model_parallel_size):
            raise AssertionError(
                "`--moe-tp-extend-ep` only support when num_experts % ( tp * ep ) == 0"
            )
        if not (args.moe_permutation_async_comm and args.moe_grouped_gemm):
            raise AssertionError(
                "`--moe-tp-extend-ep` needs `--moe-permutation-async-comm` and "
                "`--moe-grouped-gemm`."
            )
        if args.moe_expert_capacity_factor is not None:
            raise AssertionError(
                "`--moe-tp-extend-ep` only support when moe_expert_capacity_factor is None."
            )

    def register_patches(self, pm: Any, args: Namespace) -> None:
        if self.line in ("0.17", "0.18"):  # MindSpeed's MoE package imports it first
            importlib.import_module(self.targets.legacy_dispatcher)
        mappings = importlib.import_module(self.targets.tensor_parallel)
        own_topk = None
        if self.line == "0.12":  # moe_feature's own import (0.16's imports no top-k)
            own_topk = importlib.import_module(self.targets.moe_utils).topk_softmax_with_capacity
        if getattr(args, "moe_token_dispatcher_type", None) != "alltoall_seq":
            return
        if args.moe_tp_extend_ep:
            routing = make_routing_tp_extend_ep(
                own_topk,
                mappings.gather_from_sequence_parallel_region,
                mappings._split_along_first_dim,
                self.calls,
            )
            register = pm.register_patch
            register(f"{self.targets.router}.TopKRouter.routing", routing)
            if not args.moe_alltoall_overlap_comm:
                base = importlib.import_module(self.targets.moe_layer).MoELayer
                register(f"{self.targets.moe_layer}.MoELayer", make_tp_extend_ep_moe_layer(base))


class AlltoAllOverlapFeature(Feature):
    """``MoEAlltoAllOverLapFeature``: only its flag (its patches do not touch routing)."""

    def __init__(self) -> None:
        super().__init__("moe-alltoall-overlap-comm", 2)

    def register_args(self, parser: ArgumentParser) -> None:
        group = parser.add_argument_group(title=self.feature_name)
        group.add_argument("--moe-alltoall-overlap-comm", action="store_true", default=False)


class FixRouterFeature(Feature):
    def __init__(
        self, line: str, targets: Targets, get_args: Callable[[], Namespace], calls: list[str]
    ) -> None:
        super().__init__("fix-router", 0 if line == "0.12" else 2)
        self.line, self.targets, self.get_args, self.calls = line, targets, get_args, calls

    def register_args(self, parser: ArgumentParser) -> None:
        group = parser.add_argument_group(title=self.feature_name)
        group.add_argument("--fix-router", action="store_true", default=False)

    def validate_args(self, args: Any) -> None:
        if args.fix_router and args.expert_model_parallel_size <= 1:
            raise AssertionError(
                "when enable fix-router, expert_model_parallel_size must be greater than 1"
            )

    def register_patches(self, pm: Any, args: Namespace) -> None:
        triggered = args.fix_router
        if self.line == "0.12":
            triggered = triggered or getattr(args, "moe_expert_capacity_factor", None)
        if triggered:
            moe_utils = importlib.import_module(self.targets.moe_utils)
            group = getattr(moe_utils, "group_limited_topk", None)  # MindSpeed's own import
            replacement = make_topk_softmax_with_capacity(self.get_args, group, self.calls)
            target = f"{self.targets.moe_utils}.topk_softmax_with_capacity"
            pm.register_patch(target, replacement)


def features_for(
    line: str,
    targets: Targets,
    get_args: Callable[[], Namespace],
    config_patches: tuple[Any, Any, Any],
    calls: list[str],
    pre_patches: bool = True,
) -> list[Feature]:
    """The features of one MindSpeed line, in MindSpeed's order (basic first, MoE after)."""
    if line not in LINES:
        raise ValueError(f"MindSpeed line must be one of {LINES}; got {line!r}")
    found: list[Feature] = []
    if line in PRE_PATCH_LINES:
        found.append(RequirementsFeature(line, pre_patches))
    found.append(ConfigFeature(line, targets, config_patches))
    if line in PRE_PATCH_LINES:
        found.append(TransformerEngineBasicFeature(line, pre_patches))
    found += [
        TpExtendEpFeature(line, targets, calls),
        AlltoAllOverlapFeature(),
    ]
    if line != "0.16":
        found.append(FixRouterFeature(line, targets, get_args, calls))
    return found


def parser_for(manager: type[FeaturesManager]) -> ArgumentParser:
    """MindSpeed's parser: every listed feature's flags (``register_features_args``)."""
    parser = argparse.ArgumentParser(description="MindSpeed Arguments", allow_abbrev=False)
    manager.register_features_args(parser)
    return parser


def _for_each_feature(method: str) -> Any:
    """A manager classmethod that calls ``method`` of every listed feature with its argument."""

    def call(cls: Any, arg: Any) -> None:
        for feature in cls.FEATURES_LIST:
            getattr(feature, method)(arg)

    return classmethod(call)


class FeaturesManager:
    """``MindSpeedFeaturesManager`` (``features_manager/features_manager.py``, every line): class
    methods over the class-level ``FEATURES_LIST``, which ``set_features_list`` fills in place
    (``FEATURES_LIST[:] = ...``), so the list object stays the one every method reads at call
    time; the patch manager's methods are looked up at each call too. The module-level
    ``mindspeed.features_manager.FEATURES_LIST`` is another, static list that nothing applies.
    Each emulation gets its own subclass (:func:`new_features_manager`)."""

    FEATURES_LIST: ClassVar[list[Feature]] = []
    patch_manager: Any = None

    @classmethod
    def set_features_list(cls, features_list: list[Feature]) -> None:
        cls.FEATURES_LIST[:] = features_list

    @classmethod
    def apply_features_pre_patches(cls, mindspeed_args: Namespace) -> None:
        cls._register_needed("pre_register_patches", mindspeed_args)

    @classmethod
    def apply_features_patches(cls, mindspeed_args: Namespace) -> None:
        cls._register_needed("register_patches", mindspeed_args)

    @classmethod
    def _register_needed(cls, method: str, mindspeed_args: Namespace) -> None:
        """Each feature that applies to these arguments registers its patches; then apply."""
        for feature in cls.FEATURES_LIST:
            if feature.is_need_apply(mindspeed_args):
                getattr(feature, method)(cls.patch_manager, mindspeed_args)
        cls.patch_manager.apply_patches()

    register_features_args = _for_each_feature("register_args")
    pre_validate_features_args = _for_each_feature("pre_validate_args")
    post_validate_features_args = _for_each_feature("post_validate_args")
    validate_features_args = _for_each_feature("validate_args")

    @classmethod
    def remove_patches(cls) -> None:
        cls.patch_manager.remove_patches()


def new_features_manager(patch_manager: Any) -> type[FeaturesManager]:
    """A fresh ``MindSpeedFeaturesManager`` with its own empty list, over ``patch_manager``."""
    attrs = {"FEATURES_LIST": [], "patch_manager": patch_manager}
    return type("MindSpeedFeaturesManager", (FeaturesManager,), attrs)
