"""Routing replay for verl's FSDP engine, through rr_transformers' router hooks.

``rr_transformers.verl.install()`` is the one line: from then on every verl FSDP engine whose
config sets ``router_replay.mode`` to ``"R2"`` or ``"R3"`` (verl's own field, shared by its
engine configs) records and replays its routers the way verl's Megatron engine does, with verl's
own ``forward_backward_batch`` and ``forward_step`` driving each step. verl is imported on
install, never at import.
"""

from rr_transformers.verl._adapter import (
    ADAPTER,
    VerlFSDPAdapter,
    controller_of,
    installed_verl_version,
    last_report,
)
from rr_transformers.verl._errors import VerlFSDPReplayError
from rr_transformers.verl._supported import VERL_FSDP_SPECIFIER

install, uninstall, is_installed, attach, detach = ADAPTER.module_functions()

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
