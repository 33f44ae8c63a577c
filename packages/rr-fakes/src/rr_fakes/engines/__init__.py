"""Emulated rollout-engine outputs: every vLLM routed-experts format (0.14 to 0.33), vLLM's
HTTP base64 ``.npy`` form, SGLang's ``meta_info`` and knobs for the capture failures seen in
the field. Built from prompt ids, generated ids and all-layers routes; see ``vllm-facts.md``.
"""

from __future__ import annotations

from rr_fakes.engines._eras import VllmEra, era_dtype, era_of
from rr_fakes.engines._faults import NO_FAULTS, Faults
from rr_fakes.engines._objects import CompletionOutput, RequestOutput, real_vllm_outputs
from rr_fakes.engines._vllm import BlockObjectStoreError, vllm_request_output
from rr_fakes.engines._wire import (
    decode_npy_base64,
    decode_sglang_routes,
    encode_npy_base64,
    sglang_response,
    vllm_http_response,
)

__all__ = [
    "NO_FAULTS",
    "BlockObjectStoreError",
    "CompletionOutput",
    "Faults",
    "RequestOutput",
    "VllmEra",
    "decode_npy_base64",
    "decode_sglang_routes",
    "encode_npy_base64",
    "era_dtype",
    "era_of",
    "real_vllm_outputs",
    "sglang_response",
    "vllm_http_response",
    "vllm_request_output",
]
