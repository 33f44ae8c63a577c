"""The Megatron adapter (:mod:`rr_core.adapters`): the router hooks, patched through recognisable
wrapt proxies, and ``attach`` with the checks that make replay exact or raise.

Idempotent by identity, not by a flag: ``install()`` looks at what each attribute holds *now*.
If rr's proxy is reachable there (along ``__wrapped__``), nothing is done; if another library
replaced it since (MindSpeed's ``repatch()`` drops patches installed in between), rr wraps
whatever is there again. ``uninstall()`` follows :mod:`rr_core.patching`: the original goes back
where rr's proxy is on top, and rr's proxy is disabled in place where another library wrapped
over it (no foreign patch is ever undone). ``install()`` wraps what
:func:`~rr_megatron_compat._versions.hook_specs` names for the installed line.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from rr_core import ReplayController, ReplayError
from rr_core.adapters import Adapter, Attachment
from rr_core.patching import RRWrapper, active_rr_wrapper, raw_attribute
from rr_megatron_compat._versions import (
    HookSpec,
    check_supported,
    hook_specs,
    megatron_line,
)


class RRProxy(RRWrapper):
    """rr's wrapper around one Megatron attribute; ``inspect.signature`` sees the original."""


def _owner(spec: HookSpec) -> Any:
    module = importlib.import_module(spec.module)
    return module if spec.owner is None else getattr(module, spec.owner)


class MegatronAdapter(Adapter):
    """rr's hooks in megatron-core's ``TopKRouter`` (0.12 - 0.19)."""

    name = "megatron"
    module = "rr_megatron_compat"

    def check_dependencies(self, *, force: bool) -> None:
        check_supported(megatron_line(), force=force)

    def _install(self, *, force: bool) -> tuple[str, ...]:
        from rr_megatron_compat._hooks import WRAPPERS

        # resolve every target first, so a missing one patches nothing
        targets = [(spec, _owner(spec)) for spec in hook_specs(megatron_line())]
        for spec, owner in targets:
            self.patches.wrap(
                owner, spec.attribute, WRAPPERS[spec.role], kind=RRProxy, name=spec.name
            )
        return tuple(spec.name for spec, _ in targets)

    def _uninstall(self) -> int:
        from rr_megatron_compat._hooks import SAMPLE_MINOR

        SAMPLE_MINOR.clear()  # the row orders the routers routed in, kept for the hooks only
        return self.patches.restore()

    def _is_installed(self) -> bool:
        try:
            wanted = {spec.name for spec in hook_specs(megatron_line())}
        except ImportError:
            return False
        return bool(wanted) and wanted <= set(self.installed_hooks())

    def installed_hooks(self) -> tuple[str, ...]:
        """Names of the attributes where an active rr proxy is reachable right now."""
        found = (
            active_rr_wrapper(raw_attribute(owner, attribute), RRProxy)
            for owner, attribute in self.patches.live()
        )
        return tuple(proxy.rr_name for proxy in found if proxy is not None)

    def _attach(
        self,
        controller: ReplayController,
        model: Any,
        *,
        capacity: str = "warn",
        ignore_unreplayed_in_stats: bool = False,
    ) -> Attachment:
        from rr_megatron_compat._attach import attach_routers, check_attach_options

        check_attach_options(capacity, ignore_unreplayed_in_stats)
        if not self._is_installed():  # install() was called (the base checks): a re-patch since
            raise ReplayError(
                "rr's Megatron hooks are no longer in place (another library replaced them after "
                "rr_megatron_compat.install()); call rr_megatron_compat.install() again"
            )
        layers = attach_routers(
            controller,
            model,
            capacity=capacity,
            ignore_unreplayed_in_stats=ignore_unreplayed_in_stats,
        )
        return Attachment(self.name, layers, controller.num_experts, controller.top_k)


ADAPTER = MegatronAdapter()

install, uninstall, is_installed, attach, detach = ADAPTER.module_functions()


def installed_hooks() -> tuple[str, ...]:
    """Deprecated (one release): ``ADAPTER.installed_hooks()``; the module functions are the
    protocol's five alone."""
    warnings.warn(
        "rr_megatron_compat.installed_hooks() is deprecated: call "
        "rr_megatron_compat.ADAPTER.installed_hooks() (the package's module functions are the "
        "adapter protocol's install, uninstall, is_installed, attach, detach)",
        DeprecationWarning,
        stacklevel=2,
    )
    return ADAPTER.installed_hooks()
