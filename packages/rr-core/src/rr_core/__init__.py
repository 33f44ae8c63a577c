"""rr_core: exact MoE routing replay on plain torch tensors."""

from __future__ import annotations

from rr_core._errors import (
    AlignmentError,
    LayoutError,
    ReplayError,
    RouteValidationError,
    RRError,
    WalkError,
)

__version__ = "0.1.0"

__all__ = [
    "AlignmentError",
    "LayoutError",
    "RRError",
    "ReplayError",
    "RouteValidationError",
    "WalkError",
    "__version__",
]
