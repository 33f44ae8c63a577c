"""The errors of rr's verl FSDP integration."""

from __future__ import annotations

from rr_core import ReplayError


class VerlFSDPReplayError(ReplayError):
    """verl's FSDP engine cannot replay this batch or configuration as asked: names what came
    and what rr expected (the batch's ``routed_experts``, the engine setting)."""
