"""The emulated MindSpeed has the structures of MindSpeed's source (patch_utils.py, the adaptor,
arguments_basic.py, features_manager/moe) on each line: one test per structure."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rr_fakes.emulations.mindspeed import (
    LINES,
    MEGATRON_ADAPTOR,
    PRE_PATCH_LINES,
    MLATransformerConfig,
    Targets,
    TransformerConfig,
    dummy_compile,
    emulated_mindspeed,
    new_patch_manager,
)

STUB = "rr_fakes_stub_moe"
CONFIGS = "rr_fakes.emulations.mindspeed._config"
STUBS = Targets(
    transformer_config=CONFIGS,
    router=STUB,
    moe_utils=STUB,
    moe_layer=STUB,
    tensor_parallel=STUB,
    legacy_dispatcher=f"{STUB}.legacy_a2a_token_dispatcher",
)
_STUB_SOURCE = textwrap.dedent(
    """
    import types
    import torch

    SELECTED = []

    def group_limited_topk(scores, topk, num_tokens, num_experts, num_groups, group_topk):
        return torch.topk(scores, k=topk, dim=1)

    def topk_softmax_with_capacity(logits, topk, score_function="softmax", **kwargs):
        SELECTED.append("router module's top-k")
        ids = torch.topk(logits, k=topk, dim=1).indices
        routing_map = torch.zeros_like(logits).bool().scatter(1, ids, True)
        return logits.softmax(-1) * routing_map, routing_map, routing_map.sum(0)

    def gather_from_sequence_parallel_region(tensor):
        return tensor

    def _split_along_first_dim(tensor):
        return tensor

    def scale():
        return "scale"

    class TopKRouter:
        topk = 2
        routing_type = "aux_loss"
        config = types.SimpleNamespace(
            num_moe_experts=8,
            moe_expert_capacity_factor=None,
            moe_pad_expert_input_to_capacity=False,
            moe_token_drop_policy="probs",
            moe_router_pre_softmax=False,
            deterministic_mode=False,
        )

        def apply_z_loss(self, logits):
            return logits

        def aux_loss_load_balancing(self, logits):
            probs, routing_map, _ = topk_softmax_with_capacity(logits, self.topk)
            return probs, routing_map

        def routing(self, logits):
            return "original routing"

    class MoELayer:
        pass
    """
)


def _module(name: str, source: str = "") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(source, module.__dict__)
    sys.modules[name] = module
    return module


@pytest.fixture
def stub() -> Iterator[types.ModuleType]:
    """A throw-away module standing in for Megatron's router, moe_utils and moe_layer, a module
    holding ``from`` copies, and one whose name contains ``mindspeed``."""
    module = _module(STUB, _STUB_SOURCE)
    for name in ("rr_fakes_stub_copier", "rr_fakes_stub_mindspeed_copier"):
        holder = _module(name)
        holder.topk_softmax_with_capacity = module.topk_softmax_with_capacity
        holder.TopKRouter = module.TopKRouter
    yield module
    for name in (STUB, "rr_fakes_stub_copier", "rr_fakes_stub_mindspeed_copier"):
        sys.modules.pop(name, None)


def installed_line_or_none() -> str | None:
    from rr_fakes.emulations.mindspeed import installed_line

    try:
        return installed_line()
    except ValueError:
        return None


def _config(**kwargs: Any) -> Any:
    return TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, **kwargs)


# -- patch_utils.py -------------------------------------------------------------------------------
def test_patch_record_shape(stub: types.ModuleType) -> None:
    pm = new_patch_manager()

    def scale_replacement() -> str:
        return "replaced"

    def tag_wrapper(fn: Any) -> Any:
        return lambda: f"wrapped({fn()})"

    pm.register_patch(f"{STUB}.scale", scale_replacement)
    pm.register_patch(f"{STUB}.scale", tag_wrapper)
    patch = pm.patches_info[f"{STUB}.scale"]
    assert (patch.orig_module_name, patch.orig_func_name) == (STUB, "scale")  # strings
    assert (patch.patch_func, patch.wrappers, patch.is_applied) == (
        scale_replacement,
        [tag_wrapper],
        False,
    )
    original = stub.scale
    pm.apply_patches()
    assert (patch.orig_module, patch.orig_func) == (stub, original)
    assert stub.scale is patch.final_patch_func
    assert stub.scale() == "wrapped(replaced)"
    with pytest.raises(RuntimeError, match="exist"):
        pm.register_patch(f"{STUB}.scale", scale_replacement)
    pm.register_patch(f"{STUB}.scale", lambda: "forced", force_patch=True)
    pm.register_patch(f"{STUB}.missing_one")  # no function: a replacement that raises
    assert pm.patches_info[f"{STUB}.missing_one"].patch_func.__name__ == "dummy_function"
    pm.remove_patches()


def test_remove_keeps_entries_restores_classes_and_skips_mindspeed_modules(
    stub: types.ModuleType,
) -> None:
    pm = new_patch_manager()

    def routing(self: Any, logits: Any) -> str:
        return "replaced routing"

    def topk_softmax_with_capacity(*args: Any, **kwargs: Any) -> str:
        return "replaced"

    original_topk = stub.topk_softmax_with_capacity
    pm.register_patch(f"{STUB}.TopKRouter.routing", routing)
    pm.register_patch(f"{STUB}.topk_softmax_with_capacity", topk_softmax_with_capacity)
    pm.apply_patches()
    copier, ms_copier = (
        sys.modules["rr_fakes_stub_copier"],
        sys.modules["rr_fakes_stub_mindspeed_copier"],
    )
    assert copier.topk_softmax_with_capacity is topk_softmax_with_capacity  # copies follow
    pm.remove_patches()
    assert stub.TopKRouter().routing(None) == "original routing"  # class attribute restored
    assert copier.topk_softmax_with_capacity is original_topk
    assert ms_copier.topk_softmax_with_capacity is topk_softmax_with_capacity  # skipped
    for target in (f"{STUB}.TopKRouter.routing", f"{STUB}.topk_softmax_with_capacity"):
        patch = pm.patches_info[target]  # kept
        assert (patch.patch_func, patch.final_patch_func, patch.wrappers) == (None, None, [])
        assert patch.orig_func is not None
        assert patch.is_applied is False


def test_first_original_is_remembered_so_a_foreign_patch_is_discarded(
    stub: types.ModuleType,
) -> None:
    pm = new_patch_manager()

    def routing_wrapper(fn: Any) -> Any:
        return lambda self, logits: f"[{fn(self, logits)}]"

    pm.register_patch(f"{STUB}.TopKRouter.routing", routing_wrapper)
    pm.apply_patches()
    stub.TopKRouter.routing = lambda self, logits: "foreign"  # another library, in between
    pm.remove_patches()  # the foreign value is not MindSpeed's: left alone
    pm.register_patch(f"{STUB}.TopKRouter.routing", routing_wrapper)
    pm.apply_patches()
    assert stub.TopKRouter().routing(None) == "[original routing]"


def test_a_missing_module_attribute_is_created_as_none(stub: types.ModuleType) -> None:
    pm = new_patch_manager()

    def gone(*args: Any) -> str:
        return "never reached"

    pm.register_patch(f"{STUB}.removed_in_this_release", gone)
    pm.apply_patches()
    patch = pm.patches_info[f"{STUB}.removed_in_this_release"]
    assert patch.orig_func is None
    assert stub.removed_in_this_release is gone


# -- the adaptor ----------------------------------------------------------------------------------
def test_adaptor_pre_patches_before_targets_and_repatch_applies_twice(
    stub: types.ModuleType,
) -> None:
    real_compile, real_view = torch.compile, torch.Tensor.view
    bound_before = _module("rr_fakes_stub_bound_before")
    bound_before.jit_fuser = torch.compile
    try:
        with emulated_mindspeed(line="0.12", targets=STUBS) as ms:
            calls: list[int] = []
            apply = ms.manager.apply_patches
            ms.manager.apply_patches = lambda: (calls.append(1), apply())[1]  # type: ignore[method-assign]
            ms.import_adaptor()
            assert len(calls) == 2  # pre-patches, then patches
            assert torch.compile is dummy_compile
            assert ms.patch("torch.compile").patch_func
            assert bound_before.jit_fuser is real_compile  # bound earlier: keeps the real one
            assert ms.patch("torch.Tensor.view").wrappers
            assert torch.Tensor.view is not real_view
            assert torch.arange(6).view(2, 3).t().view(6).tolist() == [0, 3, 1, 4, 2, 5]
            ms.repatch({"some_flag": 1})
            assert len(calls) == 4
            assert ms.args.some_flag == 1
        assert (torch.compile, torch.Tensor.view) == (real_compile, real_view)
        assert not any(name.startswith("mindspeed") for name in sys.modules)
    finally:
        sys.modules.pop("rr_fakes_stub_bound_before", None)


# -- arguments_basic.py ---------------------------------------------------------------------------
@pytest.mark.parametrize("line", LINES)
def test_config_rebuild_structure(line: str, stub: types.ModuleType) -> None:
    with emulated_mindspeed(line=line, targets=STUBS, import_adaptor=True) as ms:
        cfg = _config()  # no unknown keyword: rebuilt all the same (MindSpeed's flags)
        assert type(cfg) is not TransformerConfig
        assert type(cfg).__name__ == "TransformerConfig"
        if sys.version_info < (3, 12):
            assert type(cfg).__module__ == "types"
        assert cfg.moe_tp_extend_ep is False
        assert cfg.optimization_level == 2
        assert TransformerConfig.__init__.__wrapped__ is not None  # a wraps'd wrapper
        assert ms.patch(f"{CONFIGS}.TransformerConfig.__post_init__").wrappers
        with pytest.raises(AttributeError, match="moe_tp_extend_ep"):
            dataclasses.replace(cfg, num_layers=4)  # the generated class skips the rebuild
        cfg.set_later = 7
        assert copy.deepcopy(cfg).set_later == 7
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(cfg)
        subclass_defaults = line in ("0.12", "0.16")
        assert (f"{CONFIGS}.TransformerConfig.__init_subclass__" in ms.manager.patches_info) is (
            subclass_defaults
        )

        @dataclasses.dataclass
        class Later(TransformerConfig):
            pass

        assert (vars(Later).get("moe_tp_extend_ep", "absent") is False) is subclass_defaults
        mla_wrapped = f"{CONFIGS}.MLATransformerConfig.__init__" in ms.manager.patches_info
        assert mla_wrapped is (line != "0.17")


def test_unknown_values_are_set_before_init_and_class_defaults_win(
    stub: types.ModuleType,
) -> None:
    seen: dict[str, Any] = {}
    TransformerConfig.enable_routing_replay = False  # type: ignore[attr-defined]
    original = TransformerConfig.__post_init__

    def spying_post_init(self: Any) -> None:
        seen["use_fused_rotary"] = getattr(self, "use_fused_rotary", None)
        original(self)

    TransformerConfig.__post_init__ = spying_post_init  # type: ignore[method-assign]
    try:
        with emulated_mindspeed(line="0.16", targets=STUBS, args={"use_fused_rotary": True}):
            importlib.import_module("mindspeed.megatron_adaptor")
            cfg = _config(enable_routing_replay=True)
            assert cfg.enable_routing_replay is False  # the class default wins
            assert seen == {"use_fused_rotary": True}  # already there inside __init__
    finally:
        TransformerConfig.__post_init__ = original  # type: ignore[method-assign]
        del TransformerConfig.enable_routing_replay  # type: ignore[attr-defined]


def test_unwrapped_init_dies_with_zero_heads(stub: types.ModuleType) -> None:
    with emulated_mindspeed(line="0.12", targets=STUBS, import_adaptor=True):
        assert _config().kv_channels == 4
        mindspeed_init = TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kwargs: Any) -> None:  # no functools.wraps
            mindspeed_init(self, *args, **kwargs)

        TransformerConfig.__init__ = careless_init  # type: ignore[method-assign]
        with pytest.raises(ZeroDivisionError):
            _config()


def test_mla_accepts_unknown_flag_only_under_mindspeed(stub: types.ModuleType) -> None:
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with pytest.raises(TypeError):
        MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
    with emulated_mindspeed(line="0.12", targets=STUBS, import_adaptor=True):
        cfg: Any = MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
        assert cfg.enable_routing_replay is True
        assert isinstance(cfg, MLATransformerConfig)


# -- features_manager/moe -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "args", "registered"),
    [
        ("0.12", {"fix_router": True, "expert_model_parallel_size": 2}, True),
        ("0.12", {"moe_expert_capacity_factor": 1.0}, True),  # either flag on 0.12
        ("0.16", {"fix_router": True}, False),  # no fix-router feature on 0.16
        ("0.17", {"moe_expert_capacity_factor": 1.0}, False),
        ("0.17", {"fix_router": True, "optimization_level": 1}, False),  # level 2 there
        ("0.18", {"fix_router": True}, True),
    ],
)
def test_fix_router_registration_per_line(
    line: str, args: dict[str, Any], registered: bool, stub: types.ModuleType
) -> None:
    target = f"{STUB}.topk_softmax_with_capacity"
    with emulated_mindspeed(line=line, targets=STUBS, args=args, import_adaptor=True) as ms:
        assert (ms.patch(target) is not None) is registered


def test_fix_router_selects_normally_then_overrides_with_arange(stub: types.ModuleType) -> None:
    logits = torch.randn(6, 4)
    native = torch.topk(torch.softmax(logits, -1), 2, dim=-1).indices.sort(-1).values
    args = {"moe_expert_capacity_factor": 1.0}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True) as ms:
        copier = sys.modules["rr_fakes_stub_copier"]
        _, routing_map, _ = copier.topk_softmax_with_capacity(logits, 2, use_pre_softmax=True)
        assert ms.bypass_calls == ["topk_softmax_with_capacity"]
        kept = routing_map.nonzero()
        assert all(int(e) in native[int(t)].tolist() for t, e in kept)  # normal selection
        ms.args.fix_router = True  # the override reads the global flag at each call
        _, routing_map, _ = stub.topk_softmax_with_capacity(logits, 2, capacity_factor=None)
        expected = (torch.arange(12).view(6, 2) % 4).sort(-1).values
        assert torch.equal(routing_map.nonzero()[:, 1].view(6, 2), expected)
        with pytest.raises(AssertionError, match="expert_model_parallel_size"):
            _config()  # fix_router with EP=1 fails the validation in __post_init__


@pytest.mark.parametrize(
    ("args", "routing", "moe_layer"),
    [
        ({"moe_tp_extend_ep": True, "moe_token_dispatcher_type": "alltoall_seq"}, True, True),
        (
            {
                "moe_tp_extend_ep": True,
                "moe_token_dispatcher_type": "alltoall_seq",
                "moe_alltoall_overlap_comm": True,
            },
            True,
            False,
        ),
        ({"moe_tp_extend_ep": True, "moe_token_dispatcher_type": "alltoall"}, False, False),
        (
            {
                "moe_tp_extend_ep": True,
                "moe_token_dispatcher_type": "alltoall_seq",
                "optimization_level": 1,
            },
            False,
            False,
        ),
    ],
)
@pytest.mark.parametrize("line", PRE_PATCH_LINES)
def test_tp_extend_ep_replaces_routing_and_moe_layer(
    line: str, args: dict[str, Any], routing: bool, moe_layer: bool, stub: types.ModuleType
) -> None:
    base = stub.MoELayer
    with emulated_mindspeed(line=line, targets=STUBS, args=args, import_adaptor=True) as ms:
        assert (ms.patch(f"{STUB}.TopKRouter.routing") is not None) is routing
        assert (stub.MoELayer is not base) is moe_layer
        if moe_layer:
            assert issubclass(stub.MoELayer, base)
        if routing:
            probs, routing_map = stub.TopKRouter().routing(torch.randn(5, 8))
            assert ms.bypass_calls == ["TopKRouter.routing"]
            assert routing_map.sum(-1).tolist() == [2] * 5
            assert torch.equal(routing_map, probs > 0)
    assert stub.MoELayer is base
    assert stub.TopKRouter().routing(None) == "original routing"


def test_real_megatron_config_class_is_generated_per_instance() -> None:
    """Where megatron-core is installed: the rebuild on the real classes."""
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    if installed_line_or_none() is None:
        pytest.skip("no MindSpeed line for the installed megatron-core")
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with emulated_mindspeed(pre_patches=False, import_adaptor=True) as ms:
        cfg = tc.TransformerConfig(**kwargs)
        assert type(cfg) is not tc.TransformerConfig
        assert type(cfg).__module__ == "types"
        assert (
            tc.TransformerConfig.__init__.__wrapped__
            is ms.patch(
                "megatron.core.transformer.transformer_config.TransformerConfig.__init__"
            ).orig_func
        )
        with pytest.raises(AttributeError):
            dataclasses.replace(cfg, num_layers=4)
    assert type(tc.TransformerConfig(**kwargs)) is tc.TransformerConfig


@pytest.mark.parametrize("line", PRE_PATCH_LINES)
def test_tp_extend_ep_routing_has_megatrons_two_parameters(
    line: str, stub: types.ModuleType
) -> None:
    with emulated_mindspeed(line=line, targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True):
        routing = stub.TopKRouter.routing
        assert routing.__name__ == "routing_tp_extend_ep"
        assert list(inspect.signature(routing).parameters) == ["self", "logits"]
        with pytest.raises(TypeError, match="padding_mask"):  # what Megatron 0.16+ passes
            stub.TopKRouter().routing(torch.randn(4, 8), padding_mask=None)


def test_tp_extend_ep_on_012_reaches_the_router_modules_top_k_only_with_aux_loss(
    stub: types.ModuleType,
) -> None:
    with emulated_mindspeed(
        line="0.12", targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True
    ) as ms:
        router = stub.TopKRouter()
        router.routing(torch.randn(4, 8))
        assert stub.SELECTED == ["router module's top-k"]  # via aux_loss_load_balancing
        traced: list[str] = []
        stub.topk_softmax_with_capacity = lambda *a, **k: traced.append("hook")  # a later hook
        router.routing_type = "none"
        _, routing_map = router.routing(torch.randn(4, 8))
        assert traced == []  # MindSpeed's own import, bound when it registered
        assert stub.SELECTED == ["router module's top-k"] * 2
        assert routing_map.sum(-1).tolist() == [2] * 4
        router.routing_type = "seq_aux_loss"
        with pytest.raises(ValueError, match="Unsupported MoE routing type"):
            router.routing(torch.randn(4, 8))
        assert ms.bypass_calls == ["TopKRouter.routing"] * 3


def test_tp_extend_ep_on_016_has_no_top_k_of_its_own(stub: types.ModuleType) -> None:
    with emulated_mindspeed(line="0.16", targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True):
        router = stub.TopKRouter()
        router.routing_type = "none"
        with pytest.raises(NameError, match="topk_softmax_with_capacity"):
            router.routing(torch.randn(4, 8))


@pytest.mark.parametrize("line", ["0.17", "0.18"])
def test_tp_extend_ep_cannot_import_on_017_and_018(line: str, stub: types.ModuleType) -> None:
    flag = {"moe_tp_extend_ep": True}
    with (
        emulated_mindspeed(line=line, targets=STUBS, args=flag) as ms,
        pytest.raises(ModuleNotFoundError, match="legacy_a2a_token_dispatcher"),
    ):
        ms.import_adaptor()
    level_1 = {"moe_tp_extend_ep": True, "optimization_level": 1}  # the feature does not apply
    with emulated_mindspeed(line=line, targets=STUBS, args=level_1, import_adaptor=True) as ms:
        assert ms.patch(f"{STUB}.TopKRouter.routing") is None


def test_tp_extend_ep_validation_reads_training_arguments(stub: types.ModuleType) -> None:
    args = {"moe_tp_extend_ep": True}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True) as ms:
        with pytest.raises(AttributeError, match="num_experts"):
            _config()  # a training argument, not a TransformerConfig field
        ms.args.num_experts = 8
        with pytest.raises(AssertionError, match="moe-grouped-gemm"):
            _config()
        ms.args.moe_permutation_async_comm = True
        assert _config(moe_grouped_gemm=True).moe_tp_extend_ep is True


# -- requirements_basic.py: the pre-patches per line ----------------------------------------------
def test_dummy_compile_returns_a_new_wrapper_closure() -> None:
    def fused(x: int) -> int:
        return x + 1

    compiled = dummy_compile(fused)
    assert compiled is not fused
    assert compiled.__name__ == "wrapper"
    assert not hasattr(compiled, "__wrapped__")
    assert compiled(1) == 2
    decorator = dummy_compile(mode="max-autotune")
    assert decorator.__name__ == "compile_wrapper"
    assert decorator(fused).__name__ == "wrapper"
    assert decorator(fused)(2) == 3


_PRE_PATCHES_012 = (
    "torch.compile",
    "torch.jit.script",
    "importlib.metadata.version",
    "transformer_engine.pytorch.LayerNorm",
    "transformer_engine.common.recipe.DelayedScaling",
    "flash_attn.flash_attn_interface.flash_attn_unpadded_func",
    "amp_C.multi_tensor_l2norm",
    "apex.multi_tensor_apply.multi_tensor_applier",
    "torch.nn.parameter.Parameter.type",
    "torch.Tensor.type",
    "torch.Tensor.view",
    "torch.distributed._all_gather_base",
    "torch.distributed.all_reduce",
    "torch._C._jit_set_nvfuser_enabled",
    "apex.optimizers.FusedAdam",
)
_PRE_PATCHES_016_ONLY = (
    "torch.cuda.nvtx.range_push",
    "transformer_engine.pytorch.ops.SwiGLU",
    "fast_hadamard_transform.hadamard_transform",
    "torch.cuda.get_device_capability",
)


@pytest.mark.parametrize("line", LINES)
def test_pre_patches_per_line(line: str, stub: types.ModuleType) -> None:
    import importlib.metadata

    real_compile, real_version = torch.compile, importlib.metadata.version
    with emulated_mindspeed(line=line, targets=STUBS, import_adaptor=True) as ms:
        registered = set(ms.manager.patches_info)
        if line in PRE_PATCH_LINES:
            assert set(_PRE_PATCHES_012) <= registered
            assert (set(_PRE_PATCHES_016_ONLY) <= registered) is (line == "0.16")
            assert importlib.metadata.version("transformer-engine") == "2.2.0"
            te = importlib.import_module("transformer_engine.pytorch")
            assert te.Linear is torch.nn.Module  # a dummy module MindSpeed created
            assert torch.zeros(1).type() == "torch.FloatTensor"
            assert MEGATRON_ADAPTOR not in sys.modules
        else:  # MindSpeed registers none; the MegatronAdaptor it imports replaced torch.compile
            assert not [t for t in registered if t.startswith(("torch.", "importlib", "apex"))]
            assert MEGATRON_ADAPTOR in sys.modules
            assert importlib.metadata.version is real_version
            assert "transformer_engine" not in sys.modules
        assert torch.compile is dummy_compile
    assert (torch.compile, importlib.metadata.version) == (real_compile, real_version)
    assert not {"transformer_engine", "apex", "amp_C", MEGATRON_ADAPTOR} & set(sys.modules)
    assert not hasattr(torch.nn.Parameter, "type") or "type" not in vars(torch.nn.Parameter)


# -- patch_utils.py: ids and getattr-based sweeps -------------------------------------------------
def test_patch_record_ids_are_properties_of_the_current_values(stub: types.ModuleType) -> None:
    pm = new_patch_manager()

    def scale_replacement() -> str:
        return "replaced"

    pm.register_patch(f"{STUB}.scale", scale_replacement)
    patch = pm.patches_info[f"{STUB}.scale"]
    assert (patch.orig_func_id, patch.patch_func_id) == (id(None), id(scale_replacement))
    original = stub.scale
    pm.apply_patches()
    assert patch.orig_func_id == id(original)
    pm.remove_patches()
    assert patch.patch_func_id == id(None)  # follows patch_func, now None


def test_sweeps_run_module_getattr(stub: types.ModuleType) -> None:
    """MindSpeed reads every module with hasattr / getattr: a lazy module's ``__getattr__``
    runs, a lazily re-exported copy is replaced, and an ImportError there ends the apply."""
    lazy = _module("rr_fakes_stub_lazy")
    asked: list[str] = []
    original = stub.scale

    def lazy_getattr(name: str) -> Any:
        asked.append(name)
        if name == "scale":
            return original  # a lazy re-export, as lazy_loader's stubs do
        raise AttributeError(name)

    lazy.__getattr__ = lazy_getattr  # type: ignore[method-assign]
    pm = new_patch_manager()

    def scale_replacement() -> str:
        return "replaced"

    try:
        pm.register_patch(f"{STUB}.scale", scale_replacement)
        pm.apply_patches()
        assert "scale" in asked
        assert vars(lazy)["scale"] is scale_replacement
        lazy.__getattr__ = lambda name: (_ for _ in ()).throw(ImportError(f"no {name}"))  # type: ignore[method-assign]
        pm.register_patch(f"{STUB}.routing_helper", scale_replacement)
        with pytest.raises(ImportError, match="routing_helper"):
            pm.apply_patches()
    finally:
        sys.modules.pop("rr_fakes_stub_lazy", None)  # first: remove_patches sweeps it too
        pm.remove_patches()


# -- features_manager.py and args_utils.py --------------------------------------------------------
def test_features_manager_list_is_live_and_the_module_list_is_not(stub: types.ModuleType) -> None:
    from rr_fakes.emulations.mindspeed import Feature

    class Marker(Feature):
        def __init__(self, target: str) -> None:
            super().__init__(f"marker-{target}", 0)
            self.target = target

        def register_patches(self, pm: Any, args: Any) -> None:
            pm.register_patch(f"{STUB}.{self.target}", lambda: self.target)

    with emulated_mindspeed(line="0.16", targets=STUBS, import_adaptor=True) as ms:
        manager_module = sys.modules["mindspeed.features_manager.features_manager"]
        manager = manager_module.MindSpeedFeaturesManager
        assert manager.FEATURES_LIST is ms.features
        manager.FEATURES_LIST.append(Marker("added_live"))
        sys.modules["mindspeed.features_manager"].FEATURES_LIST.append(Marker("added_static"))
        ms.repatch()
        assert stub.added_live() == "added_live"
        assert not hasattr(stub, "added_static")


def test_global_args_are_parsed_from_the_command_line(
    stub: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [
        "--moe-tp-extend-ep",
        "--optimization-level",
        "1",
        "--engine-flag",
        "3",
        "--pair=a",
        "--many",
        "x",
        "y",
        "--bare",
    ]
    with emulated_mindspeed(line="0.18", targets=STUBS, argv=argv) as ms:
        args = sys.modules["mindspeed.args_utils"].get_full_args()
        assert (args.moe_tp_extend_ep, args.optimization_level) == (True, 1)  # typed flags
        assert (args.engine_flag, args.pair, args.many, args.bare) == ("3", "a", ["x", "y"], True)
        assert ms.args is args
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "--fix-router"])
    with emulated_mindspeed(line="0.12", targets=STUBS, argv=None, import_adaptor=True) as ms:
        assert ms.args.fix_router is True
        assert vars(ms.args)[""] is True  # '-q' minus two characters
        with pytest.raises(TypeError, match="identifiers"):
            _config()  # MindSpeed merges the key '' into every config


# -- arguments_basic.py: the generated class ------------------------------------------------------
@pytest.mark.parametrize(("line", "rope_type"), [("0.12", None), ("0.16", "yarn"), ("0.18", None)])
def test_rope_type_none_is_dropped_only_on_016(
    line: str, rope_type: str | None, stub: types.ModuleType
) -> None:
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with emulated_mindspeed(line=line, targets=STUBS, import_adaptor=True):
        assert MLATransformerConfig(rope_type=None, **kwargs).rope_type == rope_type


def test_subclass_defaults_for_mutable_values_are_the_last_loop_value(
    stub: types.ModuleType,
) -> None:
    args = {"layer_list": [1, 2], "zz_last": 5}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True):

        @dataclasses.dataclass
        class Later(TransformerConfig):
            pass

        later = Later(num_layers=2, hidden_size=8, num_attention_heads=2)
        assert later.zz_last == 5
        assert later.layer_list == 5  # MindSpeed's lambda reads its loop variable late
