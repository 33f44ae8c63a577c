"""rr_vllm: rollout adapter for vLLM and SGLang.

Turns capture on (engine, sampling and SGLang request fields for the installed version), turns the
routed experts that vLLM and SGLang return into exact, validated route batches, and assembles
resumed, multi-turn and truncated rollouts into rr_core batches or the trainer's padded layout.
vllm itself is never imported: real and duck-typed output objects are read by attribute, and the
installed version comes from package metadata. Names load on first use, so reading this package's
supported-version table imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports

if TYPE_CHECKING:
    from rr_vllm._assemble import TrainerLayout as TrainerLayout
    from rr_vllm._assemble import assemble_multi_turn as assemble_multi_turn
    from rr_vllm._assemble import assemble_resumed as assemble_resumed
    from rr_vllm._assemble import flatten_completions as flatten_completions
    from rr_vllm._assemble import to_trainer_layout as to_trainer_layout
    from rr_vllm._assemble import truncate_response as truncate_response
    from rr_vllm._assemble import truncate_sample as truncate_sample
    from rr_vllm._batch import decode_vllm_batch as decode_vllm_batch
    from rr_vllm._capture import ModelGeometry as ModelGeometry
    from rr_vllm._capture import max_new_tokens as max_new_tokens
    from rr_vllm._capture import sglang_request_fields as sglang_request_fields
    from rr_vllm._capture import vllm_engine_args as vllm_engine_args
    from rr_vllm._capture import vllm_sampling_fields as vllm_sampling_fields
    from rr_vllm._decode import AbortPolicy as AbortPolicy
    from rr_vllm._decode import SampleRoutes as SampleRoutes
    from rr_vllm._decode import decode_routes_array as decode_routes_array
    from rr_vllm._decode import decode_vllm_output as decode_vllm_output
    from rr_vllm._errors import CaptureError as CaptureError
    from rr_vllm._errors import EngineOutputError as EngineOutputError
    from rr_vllm._errors import RouteStoreEvictedError as RouteStoreEvictedError
    from rr_vllm._store import explain_store_errors as explain_store_errors
    from rr_vllm._store import is_store_eviction as is_store_eviction
    from rr_vllm._store import routes_store_max_bytes as routes_store_max_bytes
    from rr_vllm._validate import ABORT_REASONS as ABORT_REASONS
    from rr_vllm._validate import validate_samples as validate_samples
    from rr_vllm._verl import VerlRoutes as VerlRoutes
    from rr_vllm._verl import check_verl_replayable as check_verl_replayable
    from rr_vllm._verl import concat_verl_routes as concat_verl_routes
    from rr_vllm._verl import pack_batch_for_verl as pack_batch_for_verl
    from rr_vllm._verl import pack_for_verl as pack_for_verl
    from rr_vllm._verl import to_verl_nested as to_verl_nested
    from rr_vllm._verl import to_verl_padded as to_verl_padded
    from rr_vllm._verl import unreplayable_rows as unreplayable_rows
    from rr_vllm._versions import VllmFlags as VllmFlags
    from rr_vllm._versions import installed_vllm_version as installed_vllm_version
    from rr_vllm._versions import vllm_flags as vllm_flags
    from rr_vllm._wire import decode_sglang as decode_sglang
    from rr_vllm._wire import decode_vllm_http as decode_vllm_http
    from rr_vllm._wire import npy_base64_to_array as npy_base64_to_array
    from rr_vllm._wire import sglang_base64_to_array as sglang_base64_to_array

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "ABORT_REASONS": "rr_vllm._validate",
    "AbortPolicy": "rr_vllm._decode",
    "CaptureError": "rr_vllm._errors",
    "EngineOutputError": "rr_vllm._errors",
    "ModelGeometry": "rr_vllm._capture",
    "RouteStoreEvictedError": "rr_vllm._errors",
    "SampleRoutes": "rr_vllm._decode",
    "TrainerLayout": "rr_vllm._assemble",
    "VerlRoutes": "rr_vllm._verl",
    "VllmFlags": "rr_vllm._versions",
    "assemble_multi_turn": "rr_vllm._assemble",
    "assemble_resumed": "rr_vllm._assemble",
    "check_verl_replayable": "rr_vllm._verl",
    "concat_verl_routes": "rr_vllm._verl",
    "decode_routes_array": "rr_vllm._decode",
    "decode_sglang": "rr_vllm._wire",
    "decode_vllm_http": "rr_vllm._wire",
    "decode_vllm_batch": "rr_vllm._batch",
    "decode_vllm_output": "rr_vllm._decode",
    "explain_store_errors": "rr_vllm._store",
    "flatten_completions": "rr_vllm._assemble",
    "installed_vllm_version": "rr_vllm._versions",
    "is_store_eviction": "rr_vllm._store",
    "max_new_tokens": "rr_vllm._capture",
    "npy_base64_to_array": "rr_vllm._wire",
    "pack_batch_for_verl": "rr_vllm._verl",
    "pack_for_verl": "rr_vllm._verl",
    "routes_store_max_bytes": "rr_vllm._store",
    "sglang_base64_to_array": "rr_vllm._wire",
    "sglang_request_fields": "rr_vllm._capture",
    "to_trainer_layout": "rr_vllm._assemble",
    "to_verl_nested": "rr_vllm._verl",
    "to_verl_padded": "rr_vllm._verl",
    "truncate_response": "rr_vllm._assemble",
    "truncate_sample": "rr_vllm._assemble",
    "unreplayable_rows": "rr_vllm._verl",
    "validate_samples": "rr_vllm._validate",
    "vllm_engine_args": "rr_vllm._capture",
    "vllm_flags": "rr_vllm._versions",
    "vllm_sampling_fields": "rr_vllm._capture",
}

__all__ = [
    "ABORT_REASONS",
    "AbortPolicy",
    "CaptureError",
    "EngineOutputError",
    "ModelGeometry",
    "RouteStoreEvictedError",
    "SampleRoutes",
    "TrainerLayout",
    "VerlRoutes",
    "VllmFlags",
    "__version__",
    "assemble_multi_turn",
    "assemble_resumed",
    "check_verl_replayable",
    "concat_verl_routes",
    "decode_routes_array",
    "decode_sglang",
    "decode_vllm_batch",
    "decode_vllm_http",
    "decode_vllm_output",
    "explain_store_errors",
    "flatten_completions",
    "installed_vllm_version",
    "is_store_eviction",
    "max_new_tokens",
    "npy_base64_to_array",
    "pack_batch_for_verl",
    "pack_for_verl",
    "routes_store_max_bytes",
    "sglang_base64_to_array",
    "sglang_request_fields",
    "to_trainer_layout",
    "to_verl_nested",
    "to_verl_padded",
    "truncate_response",
    "truncate_sample",
    "unreplayable_rows",
    "validate_samples",
    "vllm_engine_args",
    "vllm_flags",
    "vllm_sampling_fields",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
