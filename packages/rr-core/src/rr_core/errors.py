"""The exception hierarchy: every rr error derives from :class:`RRError`.

Messages carry the offending values (layer, micro-batch, shape, id range) and the fix.
Replay mismatches always raise; they are never downgraded to warnings.
"""

from __future__ import annotations


class RRError(Exception):
    """Base class of every error rr raises on purpose."""


class RouteValidationError(RRError, ValueError):
    """Route data is malformed: ids out of range, repeated ids, wrong shape or dtype."""


class LayoutError(RRError, ValueError):
    """A layer layout (pipeline split, MoE frequency, layer axis) is inconsistent."""


class AlignmentError(RRError, ValueError):
    """Routes cannot be aligned to the tokens they claim to describe."""


class WalkError(RRError):
    """The model walk found routers it cannot number unambiguously."""


class ReplayError(RRError):
    """Replay could not be exact: nothing armed, targets unconsumed, wrong shape or layer."""


class RRWarning(UserWarning):
    """A setting that does not take full effect, or a relaxed check that was skipped."""


class CodecError(RRError, ValueError):
    """Routes cannot be encoded or decoded exactly: unknown codec, ids a codec cannot hold."""


class RecordFileError(RRError):
    """A record file or shard index is missing, truncated, corrupted or inconsistent."""
