"""The error of rr's TRL integration."""

from __future__ import annotations

from rr_core import ReplayError


class TrlReplayError(ReplayError):
    """TRL's GRPOTrainer cannot replay as configured, or a batch's routes do not fit its rows:
    names what came and what rr expected (the trainer setting, the row, the token)."""
