"""The MindSpeed adapter (:mod:`rr_core.adapters`): replay on in every order MindSpeed and rr are
set up.

Three orders occur: MindSpeed's adaptor first, then :func:`install`; :func:`install` first and
a MindSpeed ``repatch()`` after (it re-installs ``wrapper(first_original)`` and silently drops
rr's hooks); :func:`install` before MindSpeed's very first patch. rr_megatron_compat's
``install()`` is idempotent by identity (it re-wraps only where rr's proxy is no longer
reachable). On top of it this module

- wraps the patch manager's ``apply_patches`` with a recognisable callable that re-installs
  rr's hooks after every (re)patch, so a ``repatch()`` cannot leave replay off;
- re-checks at :func:`attach` (:meth:`MindSpeedAdapter.reinstall`), which covers a MindSpeed
  that was loaded after :func:`install`;
- refuses MindSpeed replacements the router reaches (:mod:`rr_npu._routing`, re-read after every
  apply), config classes whose signature is hidden, and Megatron imported before MindSpeed's
  pre-patches (:mod:`rr_npu._order`);
- never imports Megatron itself before it is loaded: :func:`install` called earlier only records
  the request, and the hooks go in at the first MindSpeed apply rr sees or at :func:`attach`;
- installs the fused gating guard where torch_npu is loaded.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import rr_megatron_compat as rmc
from rr_core import ReplayController
from rr_core.adapters import Adapter, Attachment, NotInstalledError
from rr_core.patching import PATCH_LOCK, Patches, RRWrapper
from rr_npu._gating import GUARDS, install_gating_guard, uninstall_gating_guard, unwatch, watch
from rr_npu._mindspeed import check_config_signatures, mark_pass_throughs, patch_manager
from rr_npu._order import JIT_MODULE, check_import_order
from rr_npu._routing import check_routing_not_replaced


class ReinstallAfterApply(RRWrapper):
    """rr's wrapper around MindSpeed's ``apply_patches``: after MindSpeed (re)applies its
    patches, put back any rr hook that the re-application dropped."""


def _reinstall_after(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    if ADAPTER.install_requested:
        ADAPTER.reinstall()
    return result


def megatron_loaded() -> bool:
    """May rr import Megatron now? Once Megatron bound ``torch.compile`` (``megatron.core.jit``
    is loaded) or MindSpeed is loaded (its pre-patches ran), importing more of it changes
    nothing; before, it would run ahead of MindSpeed's pre-patches."""
    return JIT_MODULE in sys.modules or patch_manager() is not None


def _configs(model: Any) -> list[Any]:
    chunks = model if isinstance(model, Sequence) else [model]
    found: list[Any] = []
    for chunk in chunks:
        for module in chunk.modules():
            config = getattr(module, "config", None)
            if config is not None and not any(config is c for c in found):
                found.append(config)
    return found


class MindSpeedAdapter(Adapter):
    """rr's Megatron hooks under MindSpeed, the patch-manager wrapper and the gating guard."""

    name = "mindspeed"
    module = "rr_npu"

    def __init__(self) -> None:
        super().__init__()
        self.force = False  # install()'s, for the hooks put back after a MindSpeed re-patch

    def registries(self) -> tuple[Patches, ...]:
        return (self.patches, GUARDS)

    def _install(self, *, force: bool) -> tuple[str, ...]:
        self.force = force
        self.reinstall()
        return tuple(spec.name for spec in rmc.hook_specs(rmc.megatron_line()))

    def reinstall(self) -> tuple[str, ...]:
        """Check MindSpeed, then put back whatever a (re)patch dropped; returns the hooks put
        back (none while Megatron is not loaded yet: they go in once it is)."""
        with PATCH_LOCK:
            if not megatron_loaded():
                install_gating_guard()
                return ()
            check_import_order()
            check_routing_not_replaced()
            check_config_signatures()
            mark_pass_throughs(self.patches)
            before = set(rmc.ADAPTER.installed_hooks())
            rmc.install(force=self.force)
            manager = patch_manager()
            if manager is not None and not self.patches.holds(manager, "apply_patches"):
                self.patches.wrap(
                    manager, "apply_patches", _reinstall_after, kind=ReinstallAfterApply
                )
            install_gating_guard()
            return tuple(sorted(set(rmc.ADAPTER.installed_hooks()) - before))

    def _uninstall(self) -> int:
        removed = self.patches.restore()  # a manager someone re-patched since keeps theirs
        removed += uninstall_gating_guard()
        return removed + rmc.uninstall()

    def _is_installed(self) -> bool:
        return self.install_requested and rmc.is_installed()

    def _attach(
        self, controller: ReplayController, model: Any, *, capacity: str = "warn", **options: Any
    ) -> Attachment:
        rmc.check_replay_config(None, capacity=capacity)
        configs = _configs(model)
        check_routing_not_replaced(configs[0] if configs else None)  # the config names triggers
        self.reinstall()  # what a re-patch dropped, or all, where install() preceded Megatron
        found = rmc.attach(controller, model, capacity=capacity, **options)
        watch(controller)
        return Attachment(self.name, found.layer_numbers, found.num_experts, found.top_k)

    def _detach(self, controller: ReplayController) -> None:
        controller.detach()
        unwatch(controller)


ADAPTER = MindSpeedAdapter()

install, uninstall, is_installed, attach, detach = ADAPTER.module_functions()


def ensure_installed() -> tuple[str, ...]:
    """Deprecated (one release): :func:`install` is idempotent and puts back what a re-patch
    dropped, and :func:`attach` re-checks on its own. Returns the hooks put back; raises
    :class:`~rr_core.adapters.NotInstalledError` where :func:`install` was never called."""
    warnings.warn(
        "rr_npu.ensure_installed() is deprecated: call rr_npu.install() again (idempotent: it "
        "puts back what a MindSpeed re-patch dropped); rr_npu.attach() re-checks on its own",
        DeprecationWarning,
        stacklevel=2,
    )
    with PATCH_LOCK:
        if not ADAPTER.install_requested:
            raise NotInstalledError(
                "rr_npu.install() was not called; install rr's hooks before attaching"
            )
        return ADAPTER.reinstall()
