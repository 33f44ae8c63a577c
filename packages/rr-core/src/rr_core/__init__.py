"""rr_core: exact MoE routing replay on plain torch tensors.

Torch-dependent names load on first use (PEP 562), so ``import rr_core`` and the ``rr`` command
stay fast and work even where importing torch fails.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rr_core._axis import LAYER_AXES, LayerAxis
from rr_core._errors import (
    AlignmentError,
    LayoutError,
    ReplayError,
    RouteValidationError,
    RRError,
    RRWarning,
    WalkError,
)

if TYPE_CHECKING:
    from rr_core._controller import (
        DEFAULT_MICROBATCH,
        ReplayController,
        ReplayMode,
        StepReport,
        attached_router_count,
        controller_of,
        router_topk,
    )
    from rr_core._topk import TopK, native_topk, replay_topk, same_sets_T
    from rr_core._walk import decoder_scope, find_orphans, is_router_by_name, walk_routers

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "DEFAULT_MICROBATCH": "rr_core._controller",
    "ReplayController": "rr_core._controller",
    "ReplayMode": "rr_core._controller",
    "StepReport": "rr_core._controller",
    "attached_router_count": "rr_core._controller",
    "controller_of": "rr_core._controller",
    "router_topk": "rr_core._controller",
    "TopK": "rr_core._topk",
    "native_topk": "rr_core._topk",
    "replay_topk": "rr_core._topk",
    "same_sets_T": "rr_core._topk",
    "decoder_scope": "rr_core._walk",
    "find_orphans": "rr_core._walk",
    "is_router_by_name": "rr_core._walk",
    "walk_routers": "rr_core._walk",
}

__all__ = [
    "LAYER_AXES",
    "AlignmentError",
    "LayerAxis",
    "LayoutError",
    "RRError",
    "RRWarning",
    "ReplayError",
    "RouteValidationError",
    "WalkError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rr_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
