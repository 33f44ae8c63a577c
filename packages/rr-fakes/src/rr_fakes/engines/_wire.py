"""Routes on the wire: vLLM's HTTP base64 ``.npy`` strings and SGLang's ``meta_info``.

What it mirrors (``vllm-facts.md``):

- vLLM ``/v1/completions`` (non-streaming): ``choices[i].routed_experts`` is the base64 of a
  ``.npy`` file written with ``np.save(..., allow_pickle=False)``; None when the request
  aborted before any forward or capture is off.
- SGLang: ``meta_info["routed_experts"]`` is the base64 of raw int32 bytes in C order with
  **no shape header**; ``np.frombuffer`` gives a read-only flat array to reshape as
  ``(-1, num_hidden_layers, num_experts_per_tok)``; rows cover ``[start_len, seqlen - 1)``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from rr_fakes.engines._faults import (
    NO_FAULTS,
    Faults,
    IntArray,
    corrupt_ids,
    cut_rows,
    finish,
    overwrite_layer0,
)
from rr_fakes.engines._vllm import as_routes


def encode_npy_base64(array: np.ndarray) -> str:
    """vLLM's HTTP form of one routes array."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_npy_base64(text: str) -> np.ndarray:
    """The inverse of :func:`encode_npy_base64` (what a client does)."""
    array: np.ndarray = np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)
    return array


def vllm_http_response(request_output: Any, *, model: str = "rr-fakes") -> dict[str, Any]:
    """The JSON body of a non-streaming ``/v1/completions`` answer for ``request_output``
    (built by :func:`vllm_request_output`), with token ids returned."""
    choices = []
    for completion in request_output.outputs:
        routes = completion.routed_experts
        choices.append(
            {
                "index": completion.index,
                "text": completion.text,
                "logprobs": None,
                "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason,
                "prompt_token_ids": list(request_output.prompt_token_ids),
                "token_ids": list(completion.token_ids),
                "routed_experts": None if routes is None else encode_npy_base64(routes),
            }
        )
    p = len(request_output.prompt_token_ids)
    g = sum(len(c.token_ids) for c in request_output.outputs)
    return {
        "id": f"cmpl-{request_output.request_id}",
        "object": "text_completion",
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g},
    }


def sglang_response(
    *,
    prompt_ids: Sequence[int],
    generated_ids: Sequence[int],
    routes_TLK: Any,
    start_len: int = 0,
    finish_reason: str = "length",
    cached_tokens: int = 0,
    num_experts: int | None = None,
    faults: Faults = NO_FAULTS,
) -> dict[str, Any]:
    """SGLang's ``/generate`` answer with ``return_routed_experts`` (all hidden layers).

    ``routes_TLK`` holds ``P+G-1`` rows; ``start_len`` is ``routed_experts_start_len``.
    ``faults.missing`` leaves the key out (capture off on the server); ``num_experts`` is
    needed only to draw a seeded ``faults.draft_layer0``.
    """
    p, g = len(prompt_ids), len(generated_ids)
    routes = as_routes(routes_TLK)
    if g < 1 or routes.shape[0] != p + g - 1:
        raise ValueError(f"routes have {routes.shape[0]} rows; P+G-1 = {p + g - 1}")
    if not 0 <= start_len <= p:
        raise ValueError(f"routed_experts_start_len={start_len} outside 0..{p}")
    rows = cut_rows(corrupt_ids(routes, faults)[start_len:], faults)
    rows = overwrite_layer0(rows, faults, num_experts)
    reason: dict[str, Any] = {"type": "abort" if faults.aborted else finish_reason}
    if reason["type"] == "length":
        reason["length"] = g
    meta: dict[str, Any] = {
        "id": "0",
        "finish_reason": reason,
        "prompt_tokens": p,
        "completion_tokens": g,
        "cached_tokens": cached_tokens,
    }
    if not faults.missing:
        raw = finish(rows, np.dtype(np.int32), Faults(uint8_overflow=faults.uint8_overflow))
        meta["routed_experts"] = base64.b64encode(raw.tobytes(order="C")).decode("ascii")
    return {"text": "", "output_ids": list(generated_ids), "meta_info": meta}


def decode_sglang_routes(text: str, num_layers: int, top_k: int) -> IntArray:
    """What a client does with SGLang's string: a read-only ``[N, L, K]`` int32 view."""
    flat = np.frombuffer(base64.b64decode(text), dtype=np.int32)
    return flat.reshape(-1, num_layers, top_k)
