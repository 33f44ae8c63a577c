"""rr-transformers' errors: each an :class:`rr_core.RRError` naming what came and what was
expected."""

from __future__ import annotations

from rr_core import ReplayError, RRError, WalkError


class TransformersVersionError(RRError, ImportError):
    """transformers is missing, or its release is outside the supported range."""


class UnknownFamilyError(WalkError):
    """The model is not one of the MoE families whose router semantics rr knows."""


class RouterHookError(ReplayError):
    """A router of an attached model did not reach its top-k step through rr (its code is not
    the family's own, or a kernel replaced the MoE block), so replay would be silently skipped."""
