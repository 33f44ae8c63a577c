"""rr_vllm: Rollout adapter for vLLM and SGLang.

Turns the routed experts that vLLM and SGLang return into exact, validated route batches.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
