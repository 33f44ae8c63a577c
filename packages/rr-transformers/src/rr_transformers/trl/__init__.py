"""rr_transformers.trl: routing replay inside TRL's GRPOTrainer, in one line.

``import rr_transformers.trl; rr_transformers.trl.install()`` before the trainer is built:
TRL's colocated vLLM engine then returns the experts each token was routed to, the routes ride
with their rows through TRL's shuffle, split and buffering, and every policy forward (old
log-probs, a reference model, the checkpointed training forward) replays them (R3). With
``use_vllm=False`` (TRL generates with the trainer's model) rr records the routes in the rows'
first forward and replays them in their training forwards (R2). rr's
agreement per step goes into TRL's logged metrics as ``rr/...``. TRL (``>=1.16,<1.17``) is
imported at ``install()``, not before; vLLM and rr-vllm only when a ``use_vllm=True`` trainer is
built (R2 needs neither installed).
"""

from __future__ import annotations

from rr_transformers.trl._adapter import (
    INSTALLER,
    TRL_SPECIFIER,
    TrlInstaller,
    installed_trl_version,
)
from rr_transformers.trl._engine import engine_provenance
from rr_transformers.trl._errors import TrlReplayError
from rr_transformers.trl._passes import set_replay
from rr_transformers.trl._rows import ROUTES_KEY, RowRoutes

install, uninstall, is_installed = INSTALLER.install, INSTALLER.uninstall, INSTALLER.is_installed

__all__ = [
    "INSTALLER",
    "ROUTES_KEY",
    "TRL_SPECIFIER",
    "RowRoutes",
    "TrlInstaller",
    "TrlReplayError",
    "engine_provenance",
    "install",
    "installed_trl_version",
    "is_installed",
    "set_replay",
    "uninstall",
]
