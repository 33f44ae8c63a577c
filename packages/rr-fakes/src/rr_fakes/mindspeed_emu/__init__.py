"""An emulated MindSpeed for CPU tests: the patch manager, the per-instance TransformerConfig
rebuild and the routing-replacing features, installable into ``sys.modules`` for one test.

Written from the behaviour documented in ``npu-facts.md``; no MindSpeed code is used.
"""

from __future__ import annotations

from rr_fakes.mindspeed_emu._config import (
    MLATransformerConfig,
    TransformerConfig,
    make_config_init_wrapper,
)
from rr_fakes.mindspeed_emu._features import native_dense_routing
from rr_fakes.mindspeed_emu._install import EmulatedMindSpeed, dotted_name, emulated_mindspeed
from rr_fakes.mindspeed_emu._patches import Patch, PatchManager, is_stacking, resolve_owner

__all__ = [
    "EmulatedMindSpeed",
    "MLATransformerConfig",
    "Patch",
    "PatchManager",
    "TransformerConfig",
    "dotted_name",
    "emulated_mindspeed",
    "is_stacking",
    "make_config_init_wrapper",
    "native_dense_routing",
    "resolve_owner",
]
