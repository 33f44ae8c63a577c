"""Router settings under which replay cannot be exact, checked before a model is driven.

- C2: ``moe_router_fusion`` (0.14+, Transformer Engine's fused top-k) returns before any top-k
  hook, native RouterReplay included, so replay would silently not happen: an error.
- C3: a capacity factor (token dropping) is applied *after* the replayed selection, so the
  trainer can drop tokens a dropless engine kept: replay is then not equivalent. A warning by
  default, an error with ``capacity="raise"``, nothing with ``capacity="allow"``.
- Sinkhorn load balancing selects outside the hooked top-k step: an error.
"""

from __future__ import annotations

import warnings
from typing import Any

from rr_core import ReplayError, RRWarning

CAPACITY_POLICIES = ("warn", "raise", "allow")


class ReplayConfigError(ReplayError, ValueError):
    """A Megatron config setting under which replay cannot be exact."""


class ReplayNotEquivalentWarning(RRWarning):
    """Replay runs, but the trainer's routing is not the one replayed (C3)."""


def check_replay_config(config: Any, *, capacity: str = "warn") -> None:
    """Raise or warn for settings replay cannot honour (see module doc)."""
    if not isinstance(capacity, str) or capacity not in CAPACITY_POLICIES:
        raise ReplayConfigError(
            f"capacity must be one of {CAPACITY_POLICIES} ('warn' warns when a capacity factor "
            f"makes replay not equivalent, 'raise' refuses it, 'allow' skips the check); got "
            f"{capacity!r} ({type(capacity).__name__})"
        )
    if getattr(config, "moe_router_fusion", False):
        raise ReplayConfigError(
            "moe_router_fusion=True: the fused router returns before any top-k hook, so replay "
            "would be skipped silently (C2); set moe_router_fusion=False on this config; see "
            "`rr explain C2`"
        )
    if getattr(config, "moe_router_load_balancing_type", None) == "sinkhorn":
        raise ReplayConfigError(
            "moe_router_load_balancing_type='sinkhorn' selects experts outside the top-k step "
            "rr replays; use 'aux_loss', 'seq_aux_loss', 'global_aux_loss' or 'none'"
        )
    factor = getattr(config, "moe_expert_capacity_factor", None)
    if factor is not None and capacity != "allow":
        message = (
            f"moe_expert_capacity_factor={factor}: tokens are dropped after the replayed "
            "selection, so the trainer can drop tokens the (dropless) engine kept and replay is "
            "not equivalent (C3); set it to None for exact replay; see `rr explain C3`"
        )
        if capacity == "raise":
            raise ReplayConfigError(message)
        warnings.warn(message, ReplayNotEquivalentWarning, stacklevel=3)
