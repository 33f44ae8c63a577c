"""The adapter protocol: how rr plugs into a framework (Megatron, MindSpeed, transformers, verl),
as two capabilities an adapter implements separately.

:class:`Installer` hooks the framework (patches through its registry)::

    installer.install(force=False) -> tuple[str, ...]   # what is hooked; idempotent
    installer.uninstall() -> int                        # how many patches were taken out
    installer.is_installed() -> bool

:class:`Attacher` hands a model's routers to a controller::

    attacher.attach(controller, model, **options) -> Attachment
    attacher.detach(controller) -> None

:class:`Adapter` is both, for adapters whose hooks drive the routers ``attach`` finds. An adapter
implements only what it honours: an install-only side (verl's rollout, TRL's generation) is an
:class:`Installer` and has no ``attach`` to call by mistake.

What every adapter needs the same way lives here (the model is opentelemetry-python-contrib's
instrumentor base, without its singleton). :class:`Installer`: the dependency check before
anything is patched, idempotency, the one lock (:data:`rr_core.patching.PATCH_LOCK`) and the
patch registry (:attr:`Installer.patches`, whose policy toward foreign patches is in
:mod:`rr_core.patching`); a subclass writes ``_install`` and, where it has more to undo than its
registry, ``_uninstall``. :class:`Attacher`: the argument checks of ``attach`` / ``detach``; a
subclass writes ``_attach`` and optionally ``_detach``.

**Attach before install.** An :class:`Adapter`'s ``attach`` raises :class:`NotInstalledError`
unless ``install()`` was called (and not undone by ``uninstall()``) since. ``attach`` cannot tell
whether hooks put in at that moment come too late (a model compiled before, or a function
bound by name somewhere rr does not look, keeps the framework's own routing), so the program
states where rr changes the framework: at ``install()``, before the model is built or after; for
rr_npu even before Megatron is imported (the hooks go in once it is). rr_transformers installed
from ``attach`` in earlier releases; it still does for one release, with a DeprecationWarning.

Each package exposes one instance and binds its methods as module functions
(``rr_megatron_compat.install`` is ``rr_megatron_compat.ADAPTER.install``; see
:meth:`Adapter.module_functions`). :func:`adapters` lists the instances created in this
process; :func:`leaked_patches` is the one leak check the test suites use.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from torch import nn

from rr_core.checks import check_flag, check_instance, describe
from rr_core.errors import ReplayError
from rr_core.patching import PATCH_LOCK, Patches
from rr_core.replay.controller import ReplayController

__all__ = [
    "Adapter",
    "Attacher",
    "AttacherFunctions",
    "Attachment",
    "Installer",
    "InstallerFunctions",
    "ModuleFunctions",
    "NotInstalledError",
    "adapters",
    "check_controller",
    "check_model",
    "leaked_patches",
]

_ADAPTERS: weakref.WeakValueDictionary[str, Installer | Attacher] = weakref.WeakValueDictionary()


class NotInstalledError(ReplayError):
    """``attach`` was called on an adapter whose ``install()`` was not called first."""


@dataclass(frozen=True)
class Attachment:
    """What ``attach`` found and handed to the controller."""

    adapter: str  # the adapter's name ("megatron", "mindspeed", "transformers", ...)
    layer_numbers: tuple[int, ...]  # global, 1-based: one per attached router
    num_experts: int
    top_k: int


def check_controller(value: object, where: str) -> ReplayController:
    """``value`` if it is a :class:`~rr_core.ReplayController`, else :class:`ReplayError`."""
    return check_instance(
        value,
        ReplayController,
        ReplayError,
        f"{where} takes an rr_core.ReplayController as its controller",
        ". Build one with rr_core.ReplayController(num_experts=E, top_k=K)",
    )


def check_model(value: object, where: str) -> Any:
    """An ``nn.Module`` or a non-empty sequence of them (virtual-pipeline chunks)."""
    chunks = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    if not chunks or not all(isinstance(c, nn.Module) for c in chunks):
        raise ReplayError(
            f"{where} takes a torch.nn.Module or a list of model chunks (nn.Module each); got "
            f"{describe(value)}"
        )
    return value


class InstallerFunctions(NamedTuple):
    """An :class:`Installer`'s methods, bound (a package's ``install``, ...)."""

    install: Callable[..., tuple[str, ...]]
    uninstall: Callable[[], int]
    is_installed: Callable[[], bool]


class AttacherFunctions(NamedTuple):
    """An :class:`Attacher`'s methods, bound (a package's ``attach``, ``detach``)."""

    attach: Callable[..., Attachment]
    detach: Callable[[ReplayController], None]


class ModuleFunctions(NamedTuple):
    """An :class:`Adapter`'s five methods, bound."""

    install: Callable[..., tuple[str, ...]]
    uninstall: Callable[[], int]
    is_installed: Callable[[], bool]
    attach: Callable[..., Attachment]
    detach: Callable[[ReplayController], None]


class _Named:
    """What both capabilities share: a name, a public module, one entry in :func:`adapters`."""

    #: Short name, used in messages, in :class:`Attachment` and by :func:`adapters`.
    name: ClassVar[str]
    #: The public module whose functions are this adapter's methods (for messages).
    module: ClassVar[str]

    def __init__(self) -> None:
        _ADAPTERS[self.name] = self  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<rr adapter {self.name!r} ({self.module})>"


class Installer(_Named, ABC):
    """The install capability: hooks in a framework, through :attr:`patches`."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = Patches()
        self._requested = False  # install() returned since the last uninstall()

    # -- what a subclass writes ------------------------------------------------------------

    def check_dependencies(self, *, force: bool) -> None:
        """Raise an rr error naming what is missing or unsupported, before anything is
        patched; ``force`` allows a version outside the tested range."""

    @abstractmethod
    def _install(self, *, force: bool) -> tuple[str, ...]:
        """Patch what is not patched yet (through :attr:`patches`); return every name hooked."""

    def _uninstall(self) -> int:
        return self.patches.restore()

    def _is_installed(self) -> bool:
        return self.patches.in_place()

    # -- the capability --------------------------------------------------------------------

    def install(self, *, force: bool = False) -> tuple[str, ...]:
        """Hook the framework; returns the names hooked. Safe to call again at any time: what
        another library replaced since is wrapped again, what is rr's already is left."""
        check_flag(force, f"{self.module}.install(force=...)", ReplayError)
        with PATCH_LOCK:
            self.check_dependencies(force=force)
            names = self._install(force=force)
            self._requested = True
            return names

    def uninstall(self) -> int:
        """Take rr's patches out (see :mod:`rr_core.patching` for a patch laid over rr's);
        returns how many. Idempotent."""
        with PATCH_LOCK:
            self._requested = False
            return self._uninstall()

    def is_installed(self) -> bool:
        """Whether every hook is in place and rr's."""
        with PATCH_LOCK:
            return self._is_installed()

    @property
    def install_requested(self) -> bool:
        """Whether ``install()`` was called and not undone by ``uninstall()`` since (the hooks
        may still wait for the framework to be loaded, or have been dropped by a re-patch)."""
        return self._requested

    def module_functions(self) -> InstallerFunctions:
        """The methods, bound, for a package to expose as its module functions:
        ``install, uninstall, is_installed = ADAPTER.module_functions()``."""
        return InstallerFunctions(self.install, self.uninstall, self.is_installed)

    def registries(self) -> tuple[Patches, ...]:
        """Every registry this adapter patches through (:attr:`patches`, and any other a
        subclass keeps for a separate concern)."""
        return (self.patches,)

    def live_patches(self) -> list[str]:
        """``owner.attribute`` of every patch through which rr still acts."""
        return [
            f"{_owner_name(owner)}.{attribute}"
            for registry in self.registries()
            for owner, attribute in registry.live()
        ]


class Attacher(_Named, ABC):
    """The attach capability: a model's routers handed to a controller and released."""

    @abstractmethod
    def _attach(self, *args: Any, **kwargs: Any) -> Attachment:
        """``_attach(controller, model, **options)``: check the model's routers against the
        controller and attach them (options are the adapter's own keywords)."""

    def _detach(self, controller: ReplayController) -> None:
        controller.detach()

    def _before_attach(self) -> None:
        """What must hold before any router is touched (the checks of the arguments passed)."""

    def attach(self, controller: ReplayController, model: Any, **options: Any) -> Attachment:
        """Give ``controller`` the routers of ``model`` after checking they can be driven."""
        check_controller(controller, f"{self.module}.attach")
        check_model(model, f"{self.module}.attach")
        self._before_attach()
        return self._attach(controller, model, **options)

    def detach(self, controller: ReplayController) -> None:
        """Release the controller's routers (they route natively again)."""
        check_controller(controller, f"{self.module}.detach")
        self._detach(controller)

    def module_functions(self) -> AttacherFunctions:
        """The methods, bound: ``attach, detach = ADAPTER.module_functions()``."""
        return AttacherFunctions(self.attach, self.detach)


class Adapter(Installer, Attacher):
    """Both capabilities: hooks installed, then routers attached (see the module doc for the
    attach-before-install rule)."""

    def _before_attach(self) -> None:
        if not self.install_requested:
            self._attach_before_install()

    def _attach_before_install(self) -> None:
        """``attach`` came before ``install()``: the one rule is to refuse."""
        raise NotInstalledError(
            f"{self.module}.attach() was called before {self.module}.install(); install rr's "
            f"hooks first (before or after building the model), then attach"
        )

    def module_functions(self) -> ModuleFunctions:  # type: ignore[override]
        """The five methods, bound (a wider tuple than each capability's alone):
        ``install, uninstall, is_installed, attach, detach = ADAPTER.module_functions()``."""
        return ModuleFunctions(
            self.install, self.uninstall, self.is_installed, self.attach, self.detach
        )


def adapters() -> dict[str, Installer | Attacher]:
    """The adapters created in this process (their packages imported), by name."""
    return dict(_ADAPTERS)


def leaked_patches() -> dict[str, list[str]]:
    """The patches each adapter still acts through, for adapters with any (a test that leaves
    one behind changes what later tests in the same process observe)."""
    found = {
        name: adapter.live_patches()
        for name, adapter in adapters().items()
        if isinstance(adapter, Installer)
    }
    return {name: live for name, live in found.items() if live}


def _owner_name(owner: Any) -> str:
    return str(getattr(owner, "__qualname__", None) or getattr(owner, "__name__", owner))
