"""What switches a verl installation to rr, and back: :data:`ADAPTER`, the verl drop-in's
:class:`rr_core.adapters.Adapter` (``install`` / ``uninstall`` / ``is_installed`` / ``attach`` /
``detach``, under :data:`rr_core.patching.PATCH_LOCK` like every adapter).

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
from collections.abc import Callable
from typing import Any

from rr_core import ReplayController
from rr_core.adapters import Adapter, Attachment
from rr_core.patching import PATCH_LOCK, Patches, RRWrapper
from rr_core.verl_release import check_verl_release
from rr_megatron_compat.verl._chunk import release_all
from rr_megatron_compat.verl._names import NAMES, VerlNames
from rr_megatron_compat.verl._views import register_router, replay_enabled, view_of

#: verl's router-replay modules (verl 0.9.1).
VERL_MODULES = (
    "verl.utils.megatron.router_replay_patch",
    "verl.utils.megatron.router_replay_utils",
)


_ROUTER_SWAPS = Patches()
_OWN_MEGATRON_INSTALL: list[bool] = []
_MISSING = object()


class _RegisterBuilt(RRWrapper):
    """``TopKRouter.__init__``, then remember the router (recognisable on uninstall; disabled
    in place where another library wrapped over it)."""


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

    with PATCH_LOCK:
        if not is_installed():
            install()
            _OWN_MEGATRON_INSTALL.append(True)
        if _ROUTER_SWAPS.in_place():
            return
        _ROUTER_SWAPS.restore()
        router_cls = NAMES.TopKRouter
        _ROUTER_SWAPS.wrap(router_cls, "__init__", _register_after_init, kind=_RegisterBuilt)
        if "router_replay" not in vars(router_cls):
            _ROUTER_SWAPS.set(router_cls, "router_replay", _RouterReplayAttribute())


def remove_router_patch() -> int:
    """Detach every model, drop the router registry, and uninstall rr's Megatron hooks if the
    router patch installed them (idempotent). Returns how many patches it took out."""
    from rr_megatron_compat._install import uninstall

    with PATCH_LOCK:
        release_all()
        removed = _ROUTER_SWAPS.restore()
        if _OWN_MEGATRON_INSTALL:
            _OWN_MEGATRON_INSTALL.clear()
            removed += uninstall()
        return removed


class VerlAdapter(Adapter):
    """verl's two router-replay modules switched to rr's names, with rr's router patch (and
    Megatron hooks) under them. :attr:`patches` holds the module switch; models are Megatron's,
    so ``attach`` / ``detach`` are :data:`rr_megatron_compat.ADAPTER`'s."""

    name = "verl"
    module = "rr_megatron_compat.verl"
    #: verl's modules this side switches: rr_megatron_compat.verl.install() installs the side
    #: when a process imports either (verl's Megatron engine imports both).
    verl_modules = VERL_MODULES

    #: the names rr reads verl's helpers by (bound to verl's modules while installed)
    names: VerlNames = NAMES

    def __init__(self) -> None:
        super().__init__()
        self.originals: dict[str, Any] = {}  # verl's own object of each name rr replaced
        #: rr's public API as rr_megatron_compat.verl holds it now (name -> object): the names
        #: put in verl's modules (the package face hands it over; this module never imports it)
        self.api: Callable[[], dict[str, Any]] = dict

    def check_dependencies(self, *, force: bool) -> None:
        check_verl_release("rr's verl Megatron engine side", force=force)

    def registries(self) -> tuple[Patches, ...]:
        return (self.patches, _ROUTER_SWAPS)

    def _install(self, *, force: bool) -> tuple[str, ...]:
        """The router patch, then every name of verl's two router-replay modules that rr
        provides, wherever verl imported it. Returns the qualified names replaced."""
        apply_router_patch()
        if not self.patches.in_place():
            self.patches.restore()
            sources = [importlib.import_module(name) for name in VERL_MODULES]
            self.originals.clear()
            ours = self.api()
            for module in sources:
                for name, own in ours.items():
                    value = vars(module).get(name, _MISSING)
                    if value is not _MISSING and value is not own:
                        self.originals.setdefault(name, value)
            for name, original in self.originals.items():
                self.patches.set_copies(original, ours[name], name, within=_is_verl)
            self.names.bind(sources)
        return tuple(f"{owner.__name__}.{attribute}" for owner, attribute in self.patches)

    def _uninstall(self) -> int:
        """verl's own names back (where rr's are still in place, also in verl modules imported
        after install, which bound rr's names), then the router patch removed."""
        self.names.unbind()
        removed = self.patches.restore()
        ours = self.api() if self.originals else {}
        for name, original in self.originals.items():  # verl modules that bound rr's names
            removed += self.patches.restore_copies(ours[name], original, name, within=_is_verl)
        self.originals.clear()
        return removed + remove_router_patch()

    def _is_installed(self) -> bool:
        """verl's names are rr's, and so are the router patch and the Megatron hooks under them."""
        from rr_megatron_compat._install import is_installed

        return self.patches.in_place() and _ROUTER_SWAPS.in_place() and is_installed()

    def _attach(self, controller: ReplayController, model: Any, **options: Any) -> Attachment:
        import rr_megatron_compat

        found = rr_megatron_compat.attach(controller, model, **options)
        return Attachment(self.name, found.layer_numbers, found.num_experts, found.top_k)

    def _detach(self, controller: ReplayController) -> None:
        import rr_megatron_compat

        rr_megatron_compat.detach(controller)


def _is_verl(module_name: str) -> bool:
    return module_name == "verl" or module_name.startswith("verl.")


ADAPTER = VerlAdapter()
