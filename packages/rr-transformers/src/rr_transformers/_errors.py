"""rr-transformers' errors: each an :class:`rr_core.RRError` naming what came and what was
expected."""

from __future__ import annotations

from rr_core import AlignmentError, ReplayError, RRError, WalkError


class TransformersVersionError(RRError, ImportError):
    """transformers is missing, or its release is outside the supported range."""


class UnknownFamilyError(WalkError):
    """The model is not one of the MoE families whose router semantics rr knows."""


class RouterHookError(ReplayError):
    """A router of an attached model did not reach its top-k step through rr (its code is not
    the family's own, or a kernel replaced the MoE block), so replay would be silently skipped."""


class PackedForwardError(AlignmentError):
    """The forward of a micro-batch armed packed would not compute the packed sequences apart
    (a KV cache, a 2D attention mask, missing or other position ids): its logits would belong
    to another computation than the one the routes were laid out for."""
