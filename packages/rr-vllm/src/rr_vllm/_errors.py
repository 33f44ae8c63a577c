"""Errors of the rollout adapter; all derive from rr_core's :class:`~rr_core.RRError`."""

from __future__ import annotations

from rr_core import RouteValidationError


class EngineOutputError(RouteValidationError):
    """An engine's routed-experts output cannot be turned into exact routes: missing where it
    must exist (D3), lost to preemption (vLLM 0.21), corrupt on the wire, or shaped wrongly."""
