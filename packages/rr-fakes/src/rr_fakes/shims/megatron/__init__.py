"""Real megatron-core run under shims on CPU: the harness that shims what a machine without CUDA
lacks, gloo process groups with Megatron's parallel state, a multi-process launcher, and builders
of tiny GPTModel MoE models.

Names load on first use (lazy_loader): importing this package imports neither megatron nor torch,
so the version table (``MEGATRON_LINES``, rr_megatron_compat's data) stays cheap to read.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
