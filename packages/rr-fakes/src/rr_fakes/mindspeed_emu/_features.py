"""MindSpeed's features that matter for routing replay, per MindSpeed line, as each really
patches (``mindspeed/features_manager``, read on 26.1.0_core_r0.12.1 = "0.12", core_r0.16.0 =
"0.16", core_r0.17.0 = "0.17", core_r0.18.0 = "0.18").

A feature applies when ``optimization_level <= args.optimization_level`` and its flag is set, or
always when its level is 0 (``MindSpeedFeature.is_need_apply``).

- requirements (level 0, pre-patch, every line): ``torch.compile`` / ``torch.jit.script`` are
  replaced by a pass-through ``dummy_compile`` and ``torch.Tensor.view`` is wrapped
  (``ensure_contiguous_wrapper``); registered *before* Megatron is imported.
- config basic (level 0; ``megatron_basic`` on 0.12 / 0.16, ``npu_enhancement`` on 0.17 / 0.18):
  ``TransformerConfig.__init__`` and ``__post_init__`` wrappers on every line,
  ``__init_subclass__`` on 0.12 / 0.16, ``MLATransformerConfig.__init__`` on 0.12, 0.16, 0.18.
- moe_tp_extend_ep (level 2, every line): with ``moe_token_dispatcher_type == 'alltoall_seq'``
  it replaces ``TopKRouter.routing`` and, unless ``moe_alltoall_overlap_comm``, ``MoELayer``.
- fix_router: 0.12 level 0, registered when ``fix_router`` **or** ``moe_expert_capacity_factor``
  is set; 0.17 / 0.18 level 2, when ``fix_router`` is set; absent on 0.16. It replaces
  ``moe_utils.topk_softmax_with_capacity`` (on 0.17 / 0.18 Megatron's moe_utils has no such
  name any more, so the replacement lands on an attribute nothing calls). Its validation
  refuses ``fix_router`` with ``expert_model_parallel_size <= 1``.
"""

from __future__ import annotations

import importlib
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rr_fakes.mindspeed_emu._routing import (
    make_routing_tp_extend_ep,
    make_topk_softmax_with_capacity,
    make_tp_extend_ep_moe_layer,
)

LINES = ("0.12", "0.16", "0.17", "0.18")


@dataclass(frozen=True)
class Targets:
    """The modules MindSpeed patches (Megatron's by default; stand-ins in torch-only tests)."""

    transformer_config: str = "megatron.core.transformer.transformer_config"
    router: str = "megatron.core.transformer.moe.router"
    moe_utils: str = "megatron.core.transformer.moe.moe_utils"
    moe_layer: str = "megatron.core.transformer.moe.moe_layer"


def dummy_compile(*args: Any, **kwargs: Any) -> Any:
    """MindSpeed's ``torch.compile``: the function itself, or a decorator returning it."""
    if args and callable(args[0]):
        return args[0]
    return lambda fn: fn


def ensure_contiguous_wrapper(view: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return view(tensor if tensor.is_contiguous() else tensor.contiguous(), *args, **kwargs)

    return wrapper


class Feature:
    """``MindSpeedFeature``: a name (its flag), an optimisation level, flag defaults."""

    flags: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str, optimization_level: int = 2) -> None:
        self.feature_name = name.lower().strip().replace("-", "_")
        self.optimization_level = optimization_level
        self.default_patches = optimization_level == 0

    def is_need_apply(self, args: Namespace) -> bool:
        level_ok = self.optimization_level <= args.optimization_level
        return bool(level_ok and getattr(args, self.feature_name, None)) or self.default_patches

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
    def __init__(self) -> None:
        super().__init__("requirements-basic", 0)

    def pre_register_patches(self, pm: Any, args: Namespace) -> None:
        pm.register_patch("torch.compile", dummy_compile)
        pm.register_patch("torch.jit.script", dummy_compile)
        pm.register_patch("torch.Tensor.view", ensure_contiguous_wrapper)


class ConfigFeature(Feature):
    def __init__(self, line: str, targets: Targets, patches: tuple[Any, Any, Any]) -> None:
        super().__init__("megatron-basic" if line in ("0.12", "0.16") else "npu-enhancement", 0)
        self.line, self.targets, self.patches = line, targets, patches

    def register_patches(self, pm: Any, args: Namespace) -> None:
        init, post_init, init_subclass = self.patches
        tc = self.targets.transformer_config
        register = pm.register_patch
        register(f"{tc}.TransformerConfig.__init__", init)
        if self.line in ("0.12", "0.16"):
            register(f"{tc}.TransformerConfig.__init_subclass__", classmethod(init_subclass))
        register(f"{tc}.TransformerConfig.__post_init__", post_init)
        if self.line != "0.17":
            register(f"{tc}.MLATransformerConfig.__init__", init)


class TpExtendEpFeature(Feature):
    flags: ClassVar[dict[str, Any]] = {
        "moe_tp_extend_ep": False,
        "moe_permutation_async_comm": False,
        "moe_alltoall_overlap_comm": False,
    }

    def __init__(self, targets: Targets, calls: list[str]) -> None:
        super().__init__("moe-tp-extend-ep", 2)
        self.targets, self.calls = targets, calls

    def validate_args(self, args: Any) -> None:
        if args.moe_tp_extend_ep and getattr(args, "moe_expert_capacity_factor", None) is not None:
            raise AssertionError(
                "`--moe-tp-extend-ep` only support when moe_expert_capacity_factor is None."
            )

    def register_patches(self, pm: Any, args: Namespace) -> None:
        if getattr(args, "moe_token_dispatcher_type", None) != "alltoall_seq":
            return
        if args.moe_tp_extend_ep:
            register = pm.register_patch
            register(
                f"{self.targets.router}.TopKRouter.routing", make_routing_tp_extend_ep(self.calls)
            )
            if not args.moe_alltoall_overlap_comm:
                base = importlib.import_module(self.targets.moe_layer).MoELayer
                register(f"{self.targets.moe_layer}.MoELayer", make_tp_extend_ep_moe_layer(base))


class FixRouterFeature(Feature):
    flags: ClassVar[dict[str, Any]] = {"fix_router": False}

    def __init__(
        self, line: str, targets: Targets, get_args: Callable[[], Namespace], calls: list[str]
    ) -> None:
        super().__init__("fix-router", 0 if line == "0.12" else 2)
        self.line, self.targets, self.get_args, self.calls = line, targets, get_args, calls

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
) -> list[Feature]:
    """The features of one MindSpeed line, in MindSpeed's order (basic first, MoE after)."""
    if line not in LINES:
        raise ValueError(f"MindSpeed line must be one of {LINES}; got {line!r}")
    found: list[Feature] = [
        RequirementsFeature(),
        ConfigFeature(line, targets, config_patches),
        TpExtendEpFeature(targets, calls),
    ]
    if line != "0.16":
        found.append(FixRouterFeature(line, targets, get_args, calls))
    return found


def default_args(features: list[Feature]) -> dict[str, Any]:
    """What MindSpeed's parser gives when no flag is passed."""
    out: dict[str, Any] = {"optimization_level": 2}  # requirements-basic's --optimization-level
    for feature in features:
        out.update(type(feature).flags)
    return out
