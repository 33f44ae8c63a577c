"""The emulated ``mindspeed`` package in ``sys.modules`` for the span of a test.

Mirrors how MindSpeed is used (``npu-facts.md``): importing ``mindspeed.megatron_adaptor``
registers and applies every patch at once; ``mindspeed.patch_utils.MindSpeedPatchesManager``
is the patch manager; ``repatch(overrides)`` removes all patches, re-registers them with updated
arguments and applies them again (what an engine calling ``repatch`` at the end of its
constructor does). The global arguments are merged into every config construction.

Unlike MindSpeed, leaving the context restores every attribute ever patched (class attributes
too) and removes the modules, so tests can run in any order in one process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rr_fakes.mindspeed_emu._config import (
    MLATransformerConfig,
    TransformerConfig,
    make_config_init_wrapper,
)
from rr_fakes.mindspeed_emu._features import (
    make_fixed_topk_softmax_with_capacity,
    make_tp_extend_ep_routing,
)
from rr_fakes.mindspeed_emu._patches import Patch, PatchManager

ADAPTOR = "mindspeed.megatron_adaptor"
_MODULES = ("mindspeed", "mindspeed.patch_utils", ADAPTOR)


def dotted_name(owner: type | types.ModuleType, attribute: str) -> str:
    """The dotted patch target of ``owner.attribute`` (a class or a module)."""
    if isinstance(owner, types.ModuleType):
        return f"{owner.__name__}.{attribute}"
    return f"{owner.__module__}.{owner.__qualname__}.{attribute}"


class EmulatedMindSpeed:
    """Handle of an installed emulation: its patch manager, global arguments and the calls
    that went through a routing-replacing feature (``bypass_calls``)."""

    def __init__(
        self,
        *,
        config_classes: Sequence[type],
        router_class: type | None,
        moe_utils: types.ModuleType | None,
        args: Mapping[str, Any],
    ) -> None:
        self.config_classes = tuple(config_classes)
        self.router_class, self.moe_utils = router_class, moe_utils
        self.args: dict[str, Any] = dict(args)
        self.manager = PatchManager()
        self.bypass_calls: list[str] = []
        self.adaptor_imported = False
        self._registered = False
        self._config_wrapper = make_config_init_wrapper(lambda: self.args)
        self._routing = make_tp_extend_ep_routing(self.bypass_calls)
        self._topk = make_fixed_topk_softmax_with_capacity(self.bypass_calls)

    @property
    def routing_replaced(self) -> bool:
        """Is ``TopKRouter.routing`` replaced (``moe_tp_extend_ep`` with ``alltoall_seq``)?"""
        return bool(self.args.get("moe_tp_extend_ep")) and (
            self.args.get("moe_token_dispatcher_type") == "alltoall_seq"
        )

    def register(self) -> None:
        """Register every patch the current arguments call for."""
        for cls in self.config_classes:
            self.manager.register_patch(dotted_name(cls, "__init__"), self._config_wrapper)
        if self.routing_replaced:
            if self.router_class is None:
                raise ValueError("moe_tp_extend_ep needs router_class (Megatron's TopKRouter)")
            self.manager.register_patch(dotted_name(self.router_class, "routing"), self._routing)
        if self.args.get("fix_router"):
            if self.moe_utils is None:
                raise ValueError("fix_router needs moe_utils (the module with the top-k function)")
            target = dotted_name(self.moe_utils, "topk_softmax_with_capacity")
            self.manager.register_patch(target, self._topk)
        self._registered = True

    def apply(self) -> None:
        """What importing ``mindspeed.megatron_adaptor`` does: register and apply all."""
        if not self._registered:
            self.register()
        self.manager.apply_patches()

    def repatch(self, overrides: Mapping[str, Any] | None = None) -> None:
        """Remove all patches, re-register with ``overrides`` merged into the arguments, apply
        again: each target gets the wrapper around its *first* original, so a patch another
        library installed in between is silently discarded."""
        self.args.update(overrides or {})
        self.manager.remove_patches()
        self.register()
        self.manager.apply_patches()

    def import_adaptor(self) -> types.ModuleType:
        """``import mindspeed.megatron_adaptor`` (applies everything on first import)."""
        return importlib.import_module(ADAPTOR)


class _AdaptorLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import mindspeed.megatron_adaptor`` apply the patches, as the real one does."""

    def __init__(self, handle: EmulatedMindSpeed) -> None:
        self.handle = handle

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != ADAPTOR:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.repatch = self.handle.repatch  # type: ignore[attr-defined]
        module.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
        self.handle.apply()
        self.handle.adaptor_imported = True


@contextmanager
def emulated_mindspeed(
    *,
    config_classes: Sequence[type] = (TransformerConfig, MLATransformerConfig),
    router_class: type | None = None,
    moe_utils: types.ModuleType | None = None,
    moe_tp_extend_ep: bool = False,
    fix_router: bool = False,
    args: Mapping[str, Any] | None = None,
    import_adaptor: bool = False,
) -> Iterator[EmulatedMindSpeed]:
    """Install an emulated ``mindspeed`` into ``sys.modules``; remove it fully on exit.

    ``config_classes`` get the rebuild wrapper on ``__init__`` (real megatron classes or the
    stand-ins); ``moe_tp_extend_ep`` (which implies the ``alltoall_seq`` dispatcher unless
    ``args`` names another) replaces ``router_class.routing``; ``fix_router`` replaces
    ``moe_utils.topk_softmax_with_capacity``. ``args`` are further global arguments. With
    ``import_adaptor`` the adaptor is imported (patches applied) before the body runs.
    """
    present = [name for name in _MODULES if name in sys.modules]
    if present:
        raise RuntimeError(
            f"{present} already in sys.modules (a real MindSpeed or another emulation); "
            "the emulation needs a process without it"
        )
    merged: dict[str, Any] = {"moe_tp_extend_ep": moe_tp_extend_ep, "fix_router": fix_router}
    if moe_tp_extend_ep:
        merged["moe_token_dispatcher_type"] = "alltoall_seq"
    merged.update(args or {})
    handle = EmulatedMindSpeed(
        config_classes=config_classes, router_class=router_class, moe_utils=moe_utils, args=merged
    )
    package = types.ModuleType("mindspeed", "Emulated MindSpeed (rr_fakes).")
    package.__path__ = []
    package.__version__ = "0.0.0+rr-fakes"  # type: ignore[attr-defined]
    package.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
    patch_utils = types.ModuleType("mindspeed.patch_utils")
    patch_utils.MindSpeedPatchesManager = handle.manager  # type: ignore[attr-defined]
    patch_utils.Patch = Patch  # type: ignore[attr-defined]
    package.patch_utils = patch_utils  # type: ignore[attr-defined]
    loader = _AdaptorLoader(handle)
    sys.modules["mindspeed"], sys.modules["mindspeed.patch_utils"] = package, patch_utils
    sys.meta_path.insert(0, loader)
    try:
        if import_adaptor:
            handle.import_adaptor()
        yield handle
    finally:
        sys.meta_path.remove(loader)
        handle.manager.restore_everything()
        for name in _MODULES:
            sys.modules.pop(name, None)
