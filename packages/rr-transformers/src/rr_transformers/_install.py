"""``install`` / ``uninstall``: the routing function of every known family, wrapped in a
:class:`RouterTopkProxy` (wrapt, so ``inspect.signature`` sees the family's own parameters and
un-installing can tell rr's wrapper from anyone else's), recorded in one
:class:`rr_core.patching.Patches` registry.

A router that no controller owns calls the family's function itself; an attached one calls
the rerouted copy (:mod:`rr_transformers._reroute`), which must route exactly one top-k call,
or :class:`RouterHookError` says why replay could not happen.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import wrapt
from packaging.version import Version

from rr_core import controller_of
from rr_core.patching import Patches
from rr_transformers._errors import RouterHookError
from rr_transformers._families import KNOWN_FAMILIES, Family
from rr_transformers._reroute import call_routed, rerouted
from rr_transformers._versions import checked_version

_PATCHES = Patches()
_LOCK = threading.Lock()


class _RoutedCall:
    """The wrapper wrapt calls: the family's function itself for a router no controller owns,
    its rerouted copy (which must route exactly one top-k call) for an attached one."""

    def __init__(self, wrapped: types.FunctionType, family: Family, on_block: bool) -> None:
        self.family, self.on_block, self.rerouted = family, on_block, rerouted(wrapped)

    def __call__(
        self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if instance is None:  # called on the class: Router.forward(router, x)
            instance, args = args[0], args[1:]
        router = instance.gate if self.on_block else instance
        controller = controller_of(router)
        if controller is None:
            return wrapped(*args, **kwargs)
        result, hits = call_routed(self.rerouted, router, controller, (instance, *args), kwargs)
        if hits != 1:
            raise RouterHookError(
                f"a {self.family.router} of an attached model made {hits} routed top-k calls "
                f"in one forward (expected 1, over [T, E={controller.num_experts}] with k="
                f"{controller.top_k}): the {self.family.model_type} routing code that ran is "
                f"not the one rr hooks in transformers {checked_version()} (a hub kernel or "
                "another patch replaced it), so replay cannot be applied; see `rr explain B3`"
            )
        return result


_FunctionWrapper: Any = wrapt.FunctionWrapper  # subclassed: typed in some wrapt releases only


class RouterTopkProxy(_FunctionWrapper):  # type: ignore[misc]
    """rr's wrapper of one family's routing function (``Router.forward``, or the MoE block's
    ``route_tokens_to_experts`` where that selects)."""

    def __init__(self, wrapped: types.FunctionType, family: Family, on_block: bool) -> None:
        super().__init__(wrapped, _RoutedCall(wrapped, family, on_block))

    @property
    def family(self) -> Family:
        wrapper: _RoutedCall = self._self_wrapper
        return wrapper.family


def _sites(version: Version) -> list[tuple[Family, type, str, bool]]:
    sites = []
    for family in KNOWN_FAMILIES.values():
        if family.available(version):
            owner, attribute, on_block = family.hook_site(version)
            sites.append((family, owner, attribute, on_block))
    return sites


def install() -> tuple[str, ...]:
    """Wrap the routing function of every known family in the installed transformers.
    Idempotent; after someone patched over rr it wraps what is there now. Returns the families
    hooked (their ``model_type``)."""
    version = checked_version()
    with _LOCK:
        if not _PATCHES.in_place():
            _PATCHES.restore()  # partly patched over: start again from what is there
            for family, owner, attribute, on_block in _sites(version):
                current = vars(owner).get(attribute)
                if not isinstance(current, types.FunctionType):
                    raise RouterHookError(
                        f"{owner.__qualname__}.{attribute} is {type(current).__name__}, not the "
                        f"{family.model_type} family's own function; rr routes through the "
                        "family's code only (uninstall the other patch first)"
                    )
                _PATCHES.set(owner, attribute, RouterTopkProxy(current, family, on_block))
        return tuple(sorted(n for n, f in KNOWN_FAMILIES.items() if f.available(version)))


def uninstall() -> int:
    """Put back every function rr wrapped that is still rr's; returns how many. Idempotent."""
    with _LOCK:
        return _PATCHES.restore()


def installed() -> bool:
    """Whether every routing function rr wrapped still carries rr's proxy."""
    return _PATCHES.in_place()


def hooked(family: Family) -> bool:
    """Whether ``family``'s routing function is rr's proxy now."""
    owner, attribute, _ = family.hook_site(checked_version())
    return isinstance(vars(owner).get(attribute), RouterTopkProxy)
