"""The router hooks: the routing function of every known family, wrapped in a
:class:`RouterTopkProxy` (wrapt, so ``inspect.signature`` sees the family's own parameters and
un-installing can tell rr's wrapper from anyone else's), recorded in the transformers adapter's
:class:`rr_core.patching.Patches` registry.

A router that no controller owns calls the family's function itself; an attached one calls
the rerouted copy (:mod:`rr_transformers._reroute`), which must route exactly one top-k call,
or :class:`RouterHookError` says why replay could not happen.
"""

from __future__ import annotations

import types
from typing import Any

from packaging.version import Version

from rr_core import controller_of
from rr_core.patching import Patches, RRWrapper
from rr_transformers._errors import RouterHookError
from rr_transformers._families import KNOWN_FAMILIES, Family
from rr_transformers._reroute import call_routed, rerouted
from rr_transformers._versions import checked_version


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


class RouterTopkProxy(RRWrapper):
    """rr's wrapper of one family's routing function (``Router.forward``, or the MoE block's
    ``route_tokens_to_experts`` where that selects)."""

    @property
    def family(self) -> Family:
        call = self._self_rr_wrapper
        assert isinstance(call, _RoutedCall)
        return call.family


def _sites(version: Version) -> list[tuple[Family, type, str, bool]]:
    sites = []
    for family in KNOWN_FAMILIES.values():
        if family.available(version):
            owner, attribute, on_block = family.hook_site(version)
            sites.append((family, owner, attribute, on_block))
    return sites


def install_hooks(patches: Patches) -> tuple[str, ...]:
    """Wrap the routing function of every known family in the installed transformers (after
    someone patched over rr: wrap what is there now). Returns the families hooked."""
    version = checked_version()
    if not patches.in_place():
        patches.restore()  # partly patched over: start again from what is there
        for family, owner, attribute, on_block in _sites(version):
            current = vars(owner).get(attribute)
            if not isinstance(current, types.FunctionType):
                raise RouterHookError(
                    f"{owner.__qualname__}.{attribute} is {type(current).__name__}, not the "
                    f"{family.model_type} family's own function; rr routes through the "
                    "family's code only (uninstall the other patch first)"
                )
            call = _RoutedCall(current, family, on_block)
            name = f"{owner.__qualname__}.{attribute}"
            patches.set(owner, attribute, RouterTopkProxy(current, call, name=name))
    return tuple(sorted(n for n, f in KNOWN_FAMILIES.items() if f.available(version)))


def hooked(family: Family) -> bool:
    """Whether ``family``'s routing function is rr's proxy now."""
    owner, attribute, _ = family.hook_site(checked_version())
    return isinstance(vars(owner).get(attribute), RouterTopkProxy)
