"""Errors of the rollout adapter; all derive from rr_core's :class:`~rr_core.RRError`."""

from __future__ import annotations

from rr_core import RouteValidationError, RRError


class EngineOutputError(RouteValidationError):
    """An engine's routed-experts output cannot be turned into exact routes: missing where it
    must exist (D3), lost to preemption (vLLM 0.21), corrupt on the wire, or shaped wrongly."""


class RouteStoreEvictedError(EngineOutputError):
    """vLLM 0.32+'s aux-output store evicted route rows that a prefix-cache hit needed
    (``BlockObjectStoreError``); the fix is a larger ``AuxOutputConfig.max_bytes``."""


class CaptureError(RRError, ValueError):
    """Capture cannot be right with this engine version, model or request: refused up front
    (vLLM < 0.14, hybrid attention before 0.22, 0.32+ without prefix caching, a prompt longer
    than ``prompt_length``, a ``routed_experts_prompt_start`` outside ``0..P``)."""


class DecodeOptionsError(RRError, TypeError):
    """A decoder was called with options it cannot use: a keyword it does not read (it would be
    ignored), or an option of the wrong type."""
