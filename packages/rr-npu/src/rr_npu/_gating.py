"""The fused gating guard: while replay is on, the trainer must take the Python top-k path.

``torch_npu.npu_moe_gating_top_k`` computes the expert ids inside one kernel, takes no forced
ids and is documented for inference only: a router that calls it can never replay, and in
RECORD it hides the ids from the hook. :func:`install_gating_guard` wraps it (on torch_npu and
on every loaded module holding a ``from torch_npu import ...`` copy) with a recognisable proxy
that raises :class:`FusedGatingError` whenever a watched controller has a router in RECORD or
REPLAY; with every watched controller OFF it calls the op unchanged (inference, rollout).

Nothing here imports torch_npu: the guard is installed only where it is already loaded (or
emulated); :func:`install_gating_guard` returns False otherwise. The guards are recorded in
:data:`GUARDS`, a :class:`rr_core.patching.Patches` registry of the MindSpeed adapter.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from rr_core import ReplayController, ReplayMode, RRError
from rr_core.adapters import check_controller
from rr_core.patching import PATCH_LOCK, Patches, RRWrapper, active_rr_wrapper

FUSED_GATING_OPS = ("npu_moe_gating_top_k",)

#: Where rr's guards sit (torch_npu and each module holding a copy of an op).
GUARDS = Patches()


class FusedGatingError(RRError):
    """A fused NPU gating op ran while replay was on (its ids can be neither forced nor seen)."""


_WATCHED: weakref.WeakSet[ReplayController] = weakref.WeakSet()


def watch(controller: ReplayController) -> None:
    """Make the guard refuse fused gating while ``controller`` records or replays."""
    check_controller(controller, "rr_npu.watch")
    with PATCH_LOCK:
        _WATCHED.add(controller)


def unwatch(controller: ReplayController) -> None:
    with PATCH_LOCK:
        _WATCHED.discard(controller)


def replay_active() -> tuple[int, ...]:
    """Layer numbers of watched routers in RECORD or REPLAY right now (empty: replay off)."""
    with PATCH_LOCK:
        controllers = list(_WATCHED)
    return tuple(
        layer
        for c in controllers
        for layer in c.layer_numbers
        if c.mode_of(layer) is not ReplayMode.OFF
    )


def _refuse_while_replaying(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    layers = replay_active()
    if layers:
        raise FusedGatingError(
            f"torch_npu.{wrapped.__name__} was called while routers of layers {list(layers)} "
            "are in RECORD/REPLAY; the fused op takes no forced ids and hides the native "
            "ones. Route through the Python top-k path while replay is on (do not enable "
            "fused gating in the trainer; keep it for inference only)"
        )
    return wrapped(*args, **kwargs)


class GatingGuard(RRWrapper):
    """rr's proxy around one fused gating op; ``inspect.signature`` sees the original."""


def install_gating_guard() -> bool:
    """Wrap the fused gating ops of an already loaded torch_npu; False when it is not loaded.
    Idempotent: an op already under rr's guard is left as it is."""
    module = sys.modules.get("torch_npu")
    if module is None:
        return False
    with PATCH_LOCK:
        for name in FUSED_GATING_OPS:
            current = getattr(module, name, None)
            if current is None or active_rr_wrapper(current, GatingGuard) is not None:
                continue
            guard = GatingGuard(current, _refuse_while_replaying, name=f"torch_npu.{name}")
            GUARDS.set_copies(current, guard, name)  # torch_npu's own and every by-name copy
    return True


def uninstall_gating_guard() -> int:
    """Put the original ops back wherever rr's guard is; returns how many ops were guarded."""
    with PATCH_LOCK:
        guarded = len(GUARDS.wrappers())
        GUARDS.restore()
        return guarded


def gating_guard_installed() -> bool:
    module = sys.modules.get("torch_npu")
    return module is not None and all(
        isinstance(getattr(module, name, None), GatingGuard)
        for name in FUSED_GATING_OPS
        if hasattr(module, name)
    )
