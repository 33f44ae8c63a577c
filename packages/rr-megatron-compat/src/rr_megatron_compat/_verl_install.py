"""What switches a verl installation to rr, and back.

Two layers, each a :class:`rr_core.patching.Patches` registry, restored only where rr's
replacement is still in place (a foreign patch over it is never undone):

- the router patch (``apply_router_replay_patch``): rr's Megatron hooks, every ``TopKRouter``
  built from now on is remembered weakly when its config enables replay (verl's
  ``RouterReplay.router_instances``), and a ``router_replay`` attribute on routers of lines
  that have no native one (0.12 - 0.15; Megatron 0.16+ sets its own);
- the module switch (``install``): every name verl's two router-replay modules define that rr
  provides is replaced by rr's, in those modules and in every ``verl.*`` module that had already
  imported it (verl's Megatron engine binds them at import), so verl's own code calls rr.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

import wrapt

from rr_core.patching import Patches
from rr_megatron_compat._verl_replay import register_router, release_all, replay_enabled, view_of

#: verl's router-replay modules (verl 0.9.1).
VERL_MODULES = (
    "verl.utils.megatron.router_replay_patch",
    "verl.utils.megatron.router_replay_utils",
)
_ROUTER_MODULE = "megatron.core.transformer.moe.router"


_LOCK = threading.RLock()
_ROUTER_SWAPS = Patches()
_MODULE_SWAPS = Patches()
_ORIGINALS: dict[str, Any] = {}  # verl's own object of each name rr replaced
_OWN_MEGATRON_INSTALL: list[bool] = []
_MISSING = object()


class _RegisterBuilt(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """``TopKRouter.__init__``, then remember the router (recognisable on uninstall)."""

    def __init__(self, wrapped: Any) -> None:
        super().__init__(wrapped, _register_after_init)


def _register_after_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    wrapped(*args, **kwargs)
    register_router(instance)


class _RouterReplayAttribute:
    """``router.router_replay`` where Megatron sets none (0.12 - 0.15): the router's rr view
    when its config enables replay (verl's rule), else None. An instance attribute (Megatron
    0.16+ sets one in ``__init__``) takes precedence."""

    def __get__(self, router: Any, owner: Any) -> Any:
        if router is None:
            return self
        return view_of(router) if replay_enabled(getattr(router, "config", None)) else None


def apply_router_patch() -> None:
    """rr's Megatron hooks plus the router registry (idempotent)."""
    from rr_megatron_compat._install import install, is_installed

    with _LOCK:
        if not is_installed():
            install()
            _OWN_MEGATRON_INSTALL.append(True)
        if _ROUTER_SWAPS.in_place():
            return
        _ROUTER_SWAPS.restore()
        router_cls = importlib.import_module(_ROUTER_MODULE).TopKRouter
        _ROUTER_SWAPS.set(router_cls, "__init__", _RegisterBuilt(vars(router_cls)["__init__"]))
        if "router_replay" not in vars(router_cls):
            _ROUTER_SWAPS.set(router_cls, "router_replay", _RouterReplayAttribute())


def remove_router_patch() -> None:
    """Detach every model, drop the router registry, and uninstall rr's Megatron hooks if the
    router patch installed them (idempotent)."""
    from rr_megatron_compat._install import uninstall

    with _LOCK:
        release_all()
        _ROUTER_SWAPS.restore()
        if _OWN_MEGATRON_INSTALL:
            _OWN_MEGATRON_INSTALL.clear()
            uninstall()


def install() -> tuple[str, ...]:
    """Switch this process's verl to rr: the router patch, then every name of verl's two
    router-replay modules that rr provides, wherever verl imported it. Returns the qualified
    names replaced. Idempotent; effective for verl modules imported before or after."""
    import rr_megatron_compat.verl as ours

    with _LOCK:
        apply_router_patch()
        if not _MODULE_SWAPS.in_place():
            _MODULE_SWAPS.restore()
            sources = [importlib.import_module(name) for name in VERL_MODULES]
            _ORIGINALS.clear()
            for module in sources:
                for name in ours.__all__:
                    value = vars(module).get(name, _MISSING)
                    if value is not _MISSING and value is not getattr(ours, name):
                        _ORIGINALS.setdefault(name, value)
            for module in _verl_modules():
                for name, original in _ORIGINALS.items():
                    if vars(module).get(name, _MISSING) is original:
                        _MODULE_SWAPS.set(module, name, getattr(ours, name))
        return tuple(f"{owner.__name__}.{attribute}" for owner, attribute in _MODULE_SWAPS)


def _verl_modules() -> list[Any]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and (name == "verl" or name.startswith("verl."))
    ]


def uninstall() -> None:
    """Give verl its own names back (where rr's are still in place, also in verl modules
    imported after :func:`install`, which bound rr's names) and remove the router patch.
    Idempotent."""
    import rr_megatron_compat.verl as ours

    with _LOCK:
        _MODULE_SWAPS.restore()
        for module in _verl_modules() if _ORIGINALS else []:
            for name, original in _ORIGINALS.items():
                if vars(module).get(name, _MISSING) is getattr(ours, name):
                    setattr(module, name, original)
        _ORIGINALS.clear()
        remove_router_patch()


def is_installed() -> bool:
    """Whether verl's router-replay names are rr's right now."""
    with _LOCK:
        return _MODULE_SWAPS.in_place() and _ROUTER_SWAPS.in_place()
