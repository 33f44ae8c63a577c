"""The emulated MindSpeed's patch registry (patch_utils.py) and adaptor: what a patch record
holds, how removal, foreign patches, ids and getattr sweeps behave, and the adaptor's
pre-patches before its patches."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from stub_targets import STUB, STUBS, stub_module

from rr_fakes.emulations.mindspeed import (
    dummy_compile,
    emulated_mindspeed,
    new_patch_manager,
)


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
    bound_before = stub_module("rr_fakes_stub_bound_before")
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
    lazy = stub_module("rr_fakes_stub_lazy")
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
