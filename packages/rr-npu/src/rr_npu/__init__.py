"""rr_npu: Routing replay on Ascend NPUs with MindSpeed.

The Ascend backend on top of rr_megatron_compat: device abstraction (explicit opt-in, torch_npu
imported only when asked), MindSpeed-aware install in every patch order, the HCCL payload
policy, NPU determinism settings and a guard against fused gating that cannot replay.
Names load on first use: ``import rr_npu`` imports neither torch nor torch_npu.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
