"""MindSpeed-aware install: replay on in every order MindSpeed and rr are set up.

Three orders occur: MindSpeed's adaptor first, then :func:`install`; :func:`install` first and
a MindSpeed ``repatch()`` after (it re-installs ``wrapper(first_original)`` and silently drops
rr's hooks); :func:`install` before MindSpeed's very first patch. rr_megatron_compat's
``install()`` is idempotent by identity (it re-wraps only where rr's proxy is no longer
reachable). On top of it this module

- wraps the patch manager's ``apply_patches`` with a recognisable callable that re-installs
  rr's hooks after every (re)patch, so a ``repatch()`` cannot leave replay off;
- re-checks at :func:`attach` (:func:`ensure_installed`), which covers a MindSpeed that was
  loaded after :func:`install`;
- refuses MindSpeed replacements the router reaches (:mod:`rr_npu._routing`, re-read after every
  apply), config classes whose signature is hidden, and Megatron imported before MindSpeed's
  pre-patches (:mod:`rr_npu._order`);
- never imports Megatron itself before it is loaded: :func:`install` called earlier only records
  the request, and the hooks go in at the first MindSpeed apply rr sees or at :func:`attach`;
- installs the fused gating guard where torch_npu is loaded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

from torch import nn

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayError
from rr_core.patching import Patches
from rr_npu._gating import install_gating_guard, uninstall_gating_guard, unwatch, watch
from rr_npu._mindspeed import check_config_signatures, mark_pass_throughs, patch_manager
from rr_npu._order import JIT_MODULE, check_import_order
from rr_npu._routing import check_routing_not_replaced

_LOCK = threading.RLock()
_STATE: dict[str, Any] = {"installed": False, "force": False}
_HOOKED = Patches()  # MindSpeed patch managers whose apply_patches rr wraps


class ReinstallAfterApply:
    """rr's wrapper around MindSpeed's ``apply_patches``: after MindSpeed (re)applies its
    patches, put back any rr hook that the re-application dropped."""

    def __init__(self, original: Any) -> None:
        self.__wrapped__ = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.__wrapped__(*args, **kwargs)
        if _STATE["installed"]:
            _reinstall()
        return result


def _hook_patch_manager() -> None:
    manager = patch_manager()
    if manager is None or _HOOKED.holds(manager, "apply_patches"):
        return
    current = getattr(manager, "apply_patches", None)
    if current is None or isinstance(current, ReinstallAfterApply):
        return
    _HOOKED.set(manager, "apply_patches", ReinstallAfterApply(current))


def _unhook_patch_managers() -> None:
    _HOOKED.restore()  # a manager someone re-patched since keeps theirs


def megatron_loaded() -> bool:
    """May rr import Megatron now? Once Megatron bound ``torch.compile`` (``megatron.core.jit``
    is loaded) or MindSpeed is loaded (its pre-patches ran), importing more of it changes
    nothing; before, it would run ahead of MindSpeed's pre-patches."""
    return JIT_MODULE in sys.modules or patch_manager() is not None


def _reinstall() -> tuple[str, ...]:
    if not megatron_loaded():
        install_gating_guard()
        return ()  # install() came first: the hooks go in once Megatron is loaded
    check_import_order()
    check_routing_not_replaced()
    check_config_signatures()
    mark_pass_throughs()
    before = set(rmc.installed_hooks())
    rmc.install(force=_STATE["force"])
    _hook_patch_manager()
    install_gating_guard()
    return tuple(sorted(set(rmc.installed_hooks()) - before))


def install(*, force: bool = False) -> tuple[str, ...]:
    """Install rr's Megatron hooks with MindSpeed awareness; returns the names hooked (now,
    or, where Megatron is not loaded yet, at the first MindSpeed apply or :func:`attach`).

    Raises :class:`RoutingReplacedError` when the router reaches a MindSpeed replacement,
    :class:`ConfigSignatureError` when a config class hides its signature and
    :class:`MindSpeedOrderError` when Megatron was imported before MindSpeed's pre-patches.
    Safe to call again at any time; ``force`` is passed to ``rr_megatron_compat.install``.
    """
    check_flag(force, "rr_npu.install(force=...)")
    with _LOCK:
        _STATE["force"] = force
        _reinstall()
        _STATE["installed"] = True
        return tuple(spec.name for spec in rmc.hook_specs(rmc.megatron_line()))


def ensure_installed() -> tuple[str, ...]:
    """Re-check MindSpeed and re-install whatever a (re)patch dropped (or everything, where
    :func:`install` came before Megatron was loaded); returns the hooks put back. Raises if
    :func:`install` was never called."""
    with _LOCK:
        if not _STATE["installed"]:
            raise ReplayError(
                "rr_npu.install() was not called; install rr's hooks before attaching"
            )
        return _reinstall()


def uninstall() -> int:
    """Remove rr's hooks, the patch-manager wrapper and the gating guard. Idempotent."""
    with _LOCK:
        _STATE["installed"] = False
        _unhook_patch_managers()
        uninstall_gating_guard()
        return rmc.uninstall()


def is_installed() -> bool:
    return bool(_STATE["installed"]) and rmc.is_installed()


def check_controller(controller: object, where: str) -> None:
    if not isinstance(controller, ReplayController):
        raise ReplayError(
            f"{where} takes an rr_core.ReplayController as its controller; got {controller!r} "
            f"({type(controller).__name__}). Build one with "
            "rr_core.ReplayController(num_experts=E, top_k=K)"
        )


def check_model(model: object, where: str) -> None:
    chunks = model if isinstance(model, Sequence) and not isinstance(model, str) else [model]
    if not chunks or not all(isinstance(c, nn.Module) for c in chunks):
        raise ReplayError(
            f"{where} takes a torch.nn.Module or a list of model chunks (nn.Module each); got "
            f"{type(model).__name__}"
        )


def check_flag(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise ReplayError(f"{what} must be True or False; got {value!r} ({type(value).__name__})")


def _configs(model: Any) -> list[Any]:
    chunks = model if isinstance(model, Sequence) else [model]
    found: list[Any] = []
    for chunk in chunks:
        for module in chunk.modules():
            config = getattr(module, "config", None)
            if config is not None and not any(config is c for c in found):
                found.append(config)
    return found


def attach(
    controller: ReplayController, model: Any, *, capacity: str = "warn", **kwargs: Any
) -> tuple[int, ...]:
    """``rr_megatron_compat.attach`` after :func:`ensure_installed` and the MindSpeed checks on
    every config of ``model``; the controller is watched by the fused gating guard."""
    check_controller(controller, "rr_npu.attach")
    check_model(model, "rr_npu.attach")
    rmc.check_replay_config(None, capacity=capacity)
    configs = _configs(model)
    check_routing_not_replaced(configs[0] if configs else None)  # the config names triggers
    ensure_installed()
    layers = rmc.attach(controller, model, capacity=capacity, **kwargs)
    watch(controller)
    return layers


def detach(controller: ReplayController) -> None:
    """``controller.detach()`` and stop watching it."""
    check_controller(controller, "rr_npu.detach")
    controller.detach()
    unwatch(controller)
