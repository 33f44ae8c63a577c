"""rr_vllm: rollout adapter for vLLM and SGLang.

Turns capture on (engine, sampling and SGLang request fields for the installed version), turns the
routed experts that vLLM and SGLang return into exact, validated route batches, and assembles
resumed, multi-turn and truncated rollouts into rr_core batches or the trainer's padded layout.
vllm itself is never imported: real and duck-typed output objects are read by attribute, and the
installed version comes from package metadata. Names load on first use, so reading this package's
supported-version table imports no torch.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
