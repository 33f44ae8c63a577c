"""rr_npu: Routing replay on Ascend NPUs with MindSpeed.

The Ascend backend: device abstraction, MindSpeed-aware install order, HCCL payload policy,
NPU determinism settings and guards against fused gating that cannot replay.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
