"""The emulated MindSpeed reproduces each documented consequence (npu-facts.md)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import pickle
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rr_fakes.mindspeed_emu import (
    MLATransformerConfig,
    PatchManager,
    TransformerConfig,
    emulated_mindspeed,
)

_STUB_SOURCE = textwrap.dedent(
    """
    import torch

    def topk_softmax_with_capacity(logits, topk, score_function="softmax"):
        return "original", topk

    def scale():
        return "scale"

    class TopKRouter:
        topk = 2

        def routing(self, logits):
            return "original routing"

    class Holder:
        def method(self):
            return "method"
    """
)


def _module(name: str, source: str = "") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(source, module.__dict__)
    sys.modules[name] = module
    return module


@pytest.fixture
def stub() -> Iterator[types.ModuleType]:
    """A throw-away module standing in for megatron's moe_utils and router module."""
    module = _module("rr_fakes_stub_moe", _STUB_SOURCE)
    copier = _module("rr_fakes_stub_copier")
    copier.__dict__["topk_softmax_with_capacity"] = module.__dict__["topk_softmax_with_capacity"]
    yield module
    for name in ("rr_fakes_stub_moe", "rr_fakes_stub_copier"):
        sys.modules.pop(name, None)


def _config(**kwargs: Any) -> Any:
    return TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, **kwargs)


# -- the patch manager -------------------------------------------------------------------------
def test_wrappers_stack_and_replacing_twice_raises(stub: types.ModuleType) -> None:
    manager = PatchManager()
    target = "rr_fakes_stub_moe.scale"

    def scale_replacement() -> str:
        return "replaced"

    def tag_wrapper(fn: Any) -> Any:
        return lambda: f"wrapped({fn()})"

    manager.register_patch(target, scale_replacement)
    manager.register_patch(target, tag_wrapper)
    with pytest.raises(RuntimeError, match="exists already"):
        manager.register_patch(target, scale_replacement)
    manager.apply_patches()
    assert stub.scale() == "wrapped(replaced)"
    assert manager.is_applied is True  # a plain bool attribute, not a method
    manager.restore_everything()
    assert stub.scale() == "scale"


def test_force_patch_replaces(stub: types.ModuleType) -> None:
    manager = PatchManager()
    manager.register_patch("rr_fakes_stub_moe.scale", lambda: "first")
    manager.register_patch("rr_fakes_stub_moe.scale", lambda: "second", force_patch=True)
    manager.apply_patches()
    assert stub.scale() == "second"
    manager.restore_everything()


def test_from_import_copies_are_patched_too(stub: types.ModuleType) -> None:
    manager = PatchManager()

    def topk_softmax_with_capacity(*args: Any, **kwargs: Any) -> str:
        return "patched"

    manager.register_patch(
        "rr_fakes_stub_moe.topk_softmax_with_capacity", topk_softmax_with_capacity
    )
    manager.apply_patches()
    copier = sys.modules["rr_fakes_stub_copier"]
    assert copier.topk_softmax_with_capacity(None, 2) == "patched"
    manager.remove_patches()  # module attributes (and their copies) come back
    assert copier.topk_softmax_with_capacity(None, 2) == ("original", 2)
    assert stub.topk_softmax_with_capacity(None, 2) == ("original", 2)


def test_remove_restores_modules_but_not_classes(stub: types.ModuleType) -> None:
    manager = PatchManager()

    def method_wrapper(fn: Any) -> Any:
        return lambda self: "wrapped " + fn(self)

    def scale_wrapper(fn: Any) -> Any:
        return lambda: "wrapped " + fn()

    manager.register_patch("rr_fakes_stub_moe.Holder.method", method_wrapper)
    manager.register_patch("rr_fakes_stub_moe.scale", scale_wrapper)
    manager.apply_patches()
    manager.remove_patches()
    assert manager.is_applied is False
    assert stub.scale() == "scale"
    assert stub.Holder().method() == "wrapped method"  # the class keeps the patch
    manager.restore_everything()
    assert stub.Holder().method() == "method"


def test_first_original_is_remembered(stub: types.ModuleType) -> None:
    manager = PatchManager()

    def method_wrapper(fn: Any) -> Any:
        return lambda self: f"[{fn(self)}]"

    target = "rr_fakes_stub_moe.Holder.method"
    manager.register_patch(target, method_wrapper)
    manager.apply_patches()
    manager.remove_patches()  # the class attribute stays patched
    manager.register_patch(target, method_wrapper)
    manager.apply_patches()
    assert stub.Holder().method() == "[method]"  # wraps the first original, not itself
    manager.restore_everything()


# -- the emulated package ------------------------------------------------------------------------
def test_adaptor_import_applies_and_exit_removes_everything() -> None:
    original_init = TransformerConfig.__init__
    with emulated_mindspeed() as ms:
        assert not ms.manager.is_applied
        from mindspeed.patch_utils import MindSpeedPatchesManager

        assert MindSpeedPatchesManager is ms.manager
        importlib.import_module("mindspeed.megatron_adaptor")
        assert ms.manager.is_applied is True
        assert ms.adaptor_imported
        assert TransformerConfig.__init__ is not original_init
        with pytest.raises(RuntimeError, match=r"already in sys\.modules"), emulated_mindspeed():
            pass
    assert TransformerConfig.__init__ is original_init
    assert not any(name.startswith("mindspeed") for name in sys.modules)


def test_repatch_discards_a_foreign_patch() -> None:
    state = {"patched": False}

    def install_foreign() -> None:  # a library guarding re-installation with a flag
        if state["patched"]:
            return
        original = TransformerConfig.__init__

        @functools.wraps(original)
        def foreign_init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self.foreign_marker = True

        TransformerConfig.__init__ = foreign_init  # type: ignore[method-assign]
        state["patched"] = True

    with emulated_mindspeed(import_adaptor=True) as ms:
        install_foreign()
        assert getattr(_config(), "foreign_marker", False)
        ms.repatch({"some_flag": 1})
        install_foreign()  # the guard thinks the patch is still there
        cfg = _config()
        assert not hasattr(cfg, "foreign_marker")
        assert cfg.some_flag == 1


def test_replay_install_before_first_patch_survives() -> None:
    original = TransformerConfig.__init__

    @functools.wraps(original)
    def replay_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.replay_marker = True

    TransformerConfig.__init__ = replay_init  # type: ignore[method-assign]
    try:
        with emulated_mindspeed(import_adaptor=True) as ms:
            ms.repatch()
            assert _config().replay_marker
    finally:
        TransformerConfig.__init__ = original  # type: ignore[method-assign]


# -- the TransformerConfig rebuild ---------------------------------------------------------------
def test_rebuilt_config_class_pickle_replace_deepcopy() -> None:
    with emulated_mindspeed(import_adaptor=True, args={"use_fused_rotary": True}):
        cfg = _config()
        assert type(cfg) is not TransformerConfig
        assert issubclass(type(cfg), TransformerConfig)
        assert (type(cfg).__name__, type(cfg).__module__) == ("TransformerConfig", "types")
        assert type(_config()) is not type(cfg)  # one class per instance
        assert cfg.use_fused_rotary is True
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(cfg)
        cfg.set_later = 7
        replaced = dataclasses.replace(cfg, num_layers=4)
        assert replaced.num_layers == 4
        assert not hasattr(replaced, "set_later")
        assert not hasattr(replaced, "use_fused_rotary")
        kept = copy.deepcopy(cfg)
        assert kept.set_later == 7
        assert kept.use_fused_rotary is True


def test_unwrapped_init_dies_with_zero_heads() -> None:
    with emulated_mindspeed(import_adaptor=True):
        assert _config().kv_channels == 4
        mindspeed_init = TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kwargs: Any) -> None:  # no functools.wraps
            mindspeed_init(self, *args, **kwargs)

        TransformerConfig.__init__ = careless_init  # type: ignore[method-assign]
        with pytest.raises(ZeroDivisionError):
            _config()


def test_class_default_strips_the_flag() -> None:
    TransformerConfig.enable_routing_replay = False  # type: ignore[attr-defined]
    try:
        with emulated_mindspeed(import_adaptor=True):
            cfg = _config(enable_routing_replay=True)
            assert cfg.enable_routing_replay is False
    finally:
        del TransformerConfig.enable_routing_replay  # type: ignore[attr-defined]


def test_mla_config_accepts_unknown_flag_only_under_mindspeed() -> None:
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with pytest.raises(TypeError):
        MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
    with emulated_mindspeed(import_adaptor=True):
        cfg: Any = MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
        assert cfg.enable_routing_replay is True
        assert isinstance(cfg, MLATransformerConfig)
        assert type(cfg).__module__ == "types"


# -- routing-replacing features ------------------------------------------------------------------
def test_moe_tp_extend_ep_replaces_router_routing(stub: types.ModuleType) -> None:
    logits = torch.randn(5, 8)
    with emulated_mindspeed(
        router_class=stub.TopKRouter, moe_tp_extend_ep=True, import_adaptor=True
    ) as ms:
        probs, routing_map = stub.TopKRouter().routing(logits)
        assert ms.bypass_calls == ["TopKRouter.routing"]
        assert routing_map.sum(dim=-1).tolist() == [2] * 5
        assert torch.equal(routing_map, probs > 0)
    assert stub.TopKRouter().routing(logits) == "original routing"


def test_tp_extend_ep_needs_alltoall_seq(stub: types.ModuleType) -> None:
    args = {"moe_token_dispatcher_type": "alltoall"}
    with emulated_mindspeed(
        router_class=stub.TopKRouter, moe_tp_extend_ep=True, args=args, import_adaptor=True
    ) as ms:
        assert not ms.routing_replaced
        assert stub.TopKRouter().routing(None) == "original routing"


def test_fix_router_replaces_topk_and_its_copies(stub: types.ModuleType) -> None:
    copier = sys.modules["rr_fakes_stub_copier"]
    with emulated_mindspeed(moe_utils=stub, fix_router=True, import_adaptor=True) as ms:
        _probs, _routing_map, tokens_per_expert = copier.topk_softmax_with_capacity(
            torch.randn(6, 4), 2
        )
        assert ms.bypass_calls == ["topk_softmax_with_capacity"]
        assert int(tokens_per_expert.sum()) == 12
    assert copier.topk_softmax_with_capacity(None, 2) == ("original", 2)


def test_real_megatron_config_is_rebuilt_the_same_way() -> None:
    """Runs where megatron-core is installed: the rebuild on the real classes."""
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with emulated_mindspeed(
        config_classes=(tc.TransformerConfig, tc.MLATransformerConfig), import_adaptor=True
    ):
        cfg = tc.TransformerConfig(enable_routing_replay=True, **kwargs)
        assert type(cfg) is not tc.TransformerConfig
        assert cfg.enable_routing_replay is True
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(cfg)
        mindspeed_init = tc.TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kw: Any) -> None:
            mindspeed_init(self, *args, **kw)

        tc.TransformerConfig.__init__ = careless_init
        with pytest.raises(ZeroDivisionError):
            tc.TransformerConfig(**kwargs)
    assert type(tc.TransformerConfig(**kwargs)) is tc.TransformerConfig
