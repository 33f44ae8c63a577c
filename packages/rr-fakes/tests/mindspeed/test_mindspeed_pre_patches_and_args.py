"""The emulated MindSpeed's pre-patches per line (requirements_basic.py), its features manager
and the training arguments parsed from the command line (features_manager.py, args_utils.py)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from stub_targets import STUB, STUBS, tiny_config

from rr_fakes.emulations.mindspeed import (
    LINES,
    MEGATRON_ADAPTOR,
    PRE_PATCH_LINES,
    dummy_compile,
    emulated_mindspeed,
)


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
            tiny_config()  # MindSpeed merges the key '' into every config
