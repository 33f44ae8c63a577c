"""rr_vllm: rollout adapter for vLLM and SGLang.

Turns the routed experts that vLLM and SGLang return into exact, validated route batches.
vllm itself is never imported here: real and duck-typed output objects are read by attribute.
Names load on first use, so reading this package's supported-version table imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports

if TYPE_CHECKING:
    from rr_vllm._decode import AbortPolicy as AbortPolicy
    from rr_vllm._decode import SampleRoutes as SampleRoutes
    from rr_vllm._decode import decode_routes_array as decode_routes_array
    from rr_vllm._decode import decode_sglang as decode_sglang
    from rr_vllm._decode import decode_vllm_http as decode_vllm_http
    from rr_vllm._decode import decode_vllm_output as decode_vllm_output
    from rr_vllm._decode import npy_base64_to_array as npy_base64_to_array
    from rr_vllm._decode import sglang_base64_to_array as sglang_base64_to_array
    from rr_vllm._errors import EngineOutputError as EngineOutputError
    from rr_vllm._validate import ABORT_REASONS as ABORT_REASONS
    from rr_vllm._validate import validate_samples as validate_samples

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "ABORT_REASONS": "rr_vllm._validate",
    "AbortPolicy": "rr_vllm._decode",
    "EngineOutputError": "rr_vllm._errors",
    "SampleRoutes": "rr_vllm._decode",
    "decode_routes_array": "rr_vllm._decode",
    "decode_sglang": "rr_vllm._decode",
    "decode_vllm_http": "rr_vllm._decode",
    "decode_vllm_output": "rr_vllm._decode",
    "npy_base64_to_array": "rr_vllm._decode",
    "sglang_base64_to_array": "rr_vllm._decode",
    "validate_samples": "rr_vllm._validate",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
