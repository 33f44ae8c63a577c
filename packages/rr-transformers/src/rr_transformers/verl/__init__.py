"""Routing replay for verl's FSDP engine, through rr_transformers' router hooks.

``rr_megatron_compat.verl.install()`` is the one line (it switches every verl side present,
this one where rr-transformers is installed): from then on every verl FSDP engine whose config
sets ``router_replay.mode`` to ``"R2"`` or ``"R3"`` (verl's own field, shared by its engine
configs) records and replays its routers the way verl's Megatron engine does, with verl's own
``forward_backward_batch`` and ``forward_step`` driving each step. ``ADAPTER.install()`` hooks
this side alone. verl is imported on install, never at import.
"""

import warnings

from rr_transformers.verl._adapter import (
    ADAPTER,
    VerlFSDPAdapter,
    controller_of,
    installed_verl_version,
    last_report,
)
from rr_transformers.verl._errors import VerlFSDPReplayError
from rr_transformers.verl._supported import VERL_FSDP_SPECIFIER

uninstall, is_installed, attach, detach = (
    ADAPTER.uninstall,
    ADAPTER.is_installed,
    ADAPTER.attach,
    ADAPTER.detach,
)


def install(*, force: bool = False) -> tuple[str, ...]:
    """Deprecated: ``rr_megatron_compat.verl.install()`` switches every verl side, this one
    among them (``ADAPTER.install()`` hooks this side alone)."""
    warnings.warn(
        "rr_transformers.verl.install() is deprecated and goes in the next release: "
        "rr_megatron_compat.verl.install() switches every verl side present, the FSDP engine "
        "among them (rr_transformers.verl.ADAPTER.install() hooks this side alone)",
        DeprecationWarning,
        stacklevel=2,
    )
    return ADAPTER.install(force=force)


__all__ = [
    "ADAPTER",
    "VERL_FSDP_SPECIFIER",
    "VerlFSDPAdapter",
    "VerlFSDPReplayError",
    "attach",
    "controller_of",
    "detach",
    "install",
    "installed_verl_version",
    "is_installed",
    "last_report",
    "uninstall",
]
