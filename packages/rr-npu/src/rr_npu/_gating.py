"""The fused gating guard: while replay is on, the trainer must take the Python top-k path.

``torch_npu.npu_moe_gating_top_k`` computes the expert ids inside one kernel, takes no forced
ids and is documented for inference only: a router that calls it can never replay, and in
RECORD it hides the ids from the hook. :func:`install_gating_guard` wraps it (on torch_npu and
on every loaded module holding a ``from torch_npu import ...`` copy) with a recognisable proxy
that raises :class:`FusedGatingError` whenever a watched controller has a router in RECORD or
REPLAY; with every watched controller OFF it calls the op unchanged (inference, rollout).

Nothing here imports torch_npu: the guard is installed only where it is already loaded (or
emulated); :func:`install_gating_guard` returns False otherwise.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import wrapt

from rr_core import ReplayController, ReplayError, ReplayMode, RRError

FUSED_GATING_OPS = ("npu_moe_gating_top_k",)


class FusedGatingError(RRError):
    """A fused NPU gating op ran while replay was on (its ids can be neither forced nor seen)."""


_LOCK = threading.RLock()
_WATCHED: weakref.WeakSet[ReplayController] = weakref.WeakSet()
_INSTALLED: list[tuple[str, GatingGuard]] = []


def watch(controller: ReplayController) -> None:
    """Make the guard refuse fused gating while ``controller`` records or replays."""
    if not isinstance(controller, ReplayController):
        raise ReplayError(
            "rr_npu.watch takes an rr_core.ReplayController; got "
            f"{controller!r} ({type(controller).__name__})"
        )
    with _LOCK:
        _WATCHED.add(controller)


def unwatch(controller: ReplayController) -> None:
    with _LOCK:
        _WATCHED.discard(controller)


def replay_active() -> tuple[int, ...]:
    """Layer numbers of watched routers in RECORD or REPLAY right now (empty: replay off)."""
    with _LOCK:
        controllers = list(_WATCHED)
    return tuple(
        layer
        for c in controllers
        for layer in c.layer_numbers
        if c.mode_of(layer) is not ReplayMode.OFF
    )


class GatingGuard(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """rr's proxy around one fused gating op; ``inspect.signature`` sees the original."""

    def __init__(self, wrapped: Any, name: str) -> None:
        super().__init__(wrapped, self._check)
        self._self_rr_op = name

    def _check(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        layers = replay_active()
        if layers:
            raise FusedGatingError(
                f"torch_npu.{self._self_rr_op} was called while routers of layers {list(layers)} "
                "are in RECORD/REPLAY; the fused op takes no forced ids and hides the native "
                "ones. Route through the Python top-k path while replay is on (do not enable "
                "fused gating in the trainer; keep it for inference only)"
            )
        return wrapped(*args, **kwargs)


def _replace_everywhere(name: str, current: Any, new: Any) -> None:
    for module in list(sys.modules.values()):
        held = getattr(module, "__dict__", {}).get(name)
        if held is current and held is not new:
            setattr(module, name, new)


def install_gating_guard() -> bool:
    """Wrap the fused gating ops of an already loaded torch_npu; False when it is not loaded.
    Idempotent: an op already under rr's guard is left as it is."""
    module = sys.modules.get("torch_npu")
    if module is None:
        return False
    with _LOCK:
        for name in FUSED_GATING_OPS:
            current = getattr(module, name, None)
            if current is None or isinstance(current, GatingGuard):
                continue
            guard = GatingGuard(current, name)
            _replace_everywhere(name, current, guard)
            _INSTALLED.append((name, guard))
    return True


def uninstall_gating_guard() -> int:
    """Put the original ops back wherever rr's guard is; returns how many were removed."""
    with _LOCK:
        removed = 0
        while _INSTALLED:
            name, guard = _INSTALLED.pop()
            _replace_everywhere(name, guard, guard.__wrapped__)
            removed += 1
        return removed


def gating_guard_installed() -> bool:
    module = sys.modules.get("torch_npu")
    return module is not None and all(
        isinstance(getattr(module, name, None), GatingGuard)
        for name in FUSED_GATING_OPS
        if hasattr(module, name)
    )
