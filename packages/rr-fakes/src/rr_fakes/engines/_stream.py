"""Emulated streamed answers of a vLLM server: ``/inference/v1/generate`` and the OpenAI path.

What it mirrors (vLLM 0.33.0, ``vllm/entrypoints/scale_out/token_in_token_out/serving.py`` and
``protocol.py``; ``vllm/v1/engine/output_processor.py`` joins the route chunks and hands them
out only when the request finishes):

- ``/inference/v1/generate``, ``stream=true`` (routes from 0.24.0, vLLM PR #44638): one
  ``data: {json}\\n\\n`` event per chunk, then ``data: [DONE]\\n\\n``. A chunk is
  ``{"request_id", "output_mode", "choices": [{"index", "finish_reason", "stop_reason",
  "token_ids", "routed_experts", ...}]}``; ``token_ids`` are the ids since the previous chunk,
  ``routed_experts`` is null except on the chunk carrying ``finish_reason``, where it is the
  base64 ``.npy`` of the whole request's rows; ``prompt_token_ids`` rides on the first chunk
  when ``return_token_ids`` is set; ``include_usage`` adds a usage-only chunk (``choices: []``).
- ``/v1/completions`` and ``/v1/chat/completions`` with ``stream=true``: the stream choices have
  no ``routed_experts`` field (vLLM RFC #56745), so the routes are gone.
"""

from __future__ import annotations

import json
from typing import Any

from rr_fakes.engines._wire import encode_npy_base64


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def _pieces(token_ids: list[int], chunk_tokens: int) -> list[list[int]]:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1; got {chunk_tokens}")
    return [token_ids[i : i + chunk_tokens] for i in range(0, len(token_ids), chunk_tokens)] or [[]]


def vllm_generate_stream(
    request_output: Any,
    *,
    chunk_tokens: int = 1,
    return_token_ids: bool = True,
    include_usage: bool = False,
    output_mode: str = "tokens",
    drop_routes: bool = False,
) -> list[str]:
    """The SSE events of a streamed ``/inference/v1/generate`` answer for ``request_output``
    (built by :func:`vllm_request_output`): ``chunk_tokens`` ids per chunk, the routes on each
    choice's final chunk (``drop_routes`` leaves them null, as a server with capture off)."""
    if output_mode not in ("tokens", "text"):
        raise ValueError(f"output_mode is 'tokens' or 'text'; got {output_mode!r}")
    events, first = [], True
    for completion in request_output.outputs:
        pieces = _pieces(list(completion.token_ids), chunk_tokens)
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            routes = completion.routed_experts if last and not drop_routes else None
            choice: dict[str, Any] = {
                "index": completion.index,
                "logprobs": None,
                "finish_reason": completion.finish_reason if last else None,
                "stop_reason": completion.stop_reason if last else None,
                "token_ids": piece,
                "routed_experts": None if routes is None else encode_npy_base64(routes),
                "sampling_mask": None,
                "weight_versions": None,
            }
            if output_mode == "text":
                choice["text"] = ""
            chunk: dict[str, Any] = {
                "request_id": request_output.request_id,
                "usage": None,
                "output_mode": output_mode,
                "choices": [choice],
            }
            if first and return_token_ids:
                chunk["prompt_token_ids"] = list(request_output.prompt_token_ids)
            first = False
            events.append(_event(chunk))
    if include_usage:
        p = len(request_output.prompt_token_ids)
        g = sum(len(c.token_ids) for c in request_output.outputs)
        usage = {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g}
        events.append(
            _event(
                {
                    "request_id": request_output.request_id,
                    "usage": usage,
                    "output_mode": output_mode,
                    "choices": [],
                }
            )
        )
    events.append("data: [DONE]\n\n")
    return events


def openai_stream(
    request_output: Any, *, chat: bool = False, chunk_tokens: int = 1, model: str = "rr-fakes"
) -> list[str]:
    """The SSE events of a streamed ``/v1/completions`` (or, ``chat``, ``/v1/chat/completions``)
    answer: token ids returned, no routes anywhere (the stream choices have no such field)."""
    events = []
    for completion in request_output.outputs:
        pieces = _pieces(list(completion.token_ids), chunk_tokens)
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            choice: dict[str, Any] = {
                "index": completion.index,
                "logprobs": None,
                "finish_reason": completion.finish_reason if last else None,
                "stop_reason": completion.stop_reason if last else None,
                "token_ids": piece,
            }
            if chat:
                choice["delta"] = {"role": "assistant", "content": ""}
            else:
                choice["text"] = ""
            events.append(
                _event(
                    {
                        "id": f"cmpl-{request_output.request_id}",
                        "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": 0,
                        "model": model,
                        "choices": [choice],
                    }
                )
            )
    events.append("data: [DONE]\n\n")
    return events
