"""rr_vllm: rollout adapter for vLLM and SGLang.

Turns the routed experts that vLLM and SGLang return into exact, validated route batches.
vllm itself is never imported here: real and duck-typed output objects are read by attribute.
"""

from __future__ import annotations

from rr_vllm._decode import (
    AbortPolicy,
    SampleRoutes,
    decode_routes_array,
    decode_sglang,
    decode_vllm_http,
    decode_vllm_output,
    npy_base64_to_array,
    sglang_base64_to_array,
)
from rr_vllm._errors import EngineOutputError
from rr_vllm._validate import ABORT_REASONS, validate_samples

__version__ = "0.1.0"

__all__ = [
    "ABORT_REASONS",
    "AbortPolicy",
    "EngineOutputError",
    "SampleRoutes",
    "__version__",
    "decode_routes_array",
    "decode_sglang",
    "decode_vllm_http",
    "decode_vllm_output",
    "npy_base64_to_array",
    "sglang_base64_to_array",
    "validate_samples",
]
