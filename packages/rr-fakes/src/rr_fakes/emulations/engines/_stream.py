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

``output_mode=None`` and :func:`openai_stream` are the forms read off a real vLLM 0.30 server
(``vllm serve --enable-return-routed-experts --enable-scale-out``).
"""

from __future__ import annotations

import json
from typing import Any

from rr_fakes.emulations.engines._wire import SYSTEM_FINGERPRINT, encode_npy_base64


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
    output_mode: str | None = "tokens",
    drop_routes: bool = False,
) -> list[str]:
    """The SSE events of a streamed ``/inference/v1/generate`` answer for ``request_output``
    (built by :func:`vllm_request_output`): ``chunk_tokens`` ids per chunk, the routes on each
    choice's final chunk (``drop_routes`` leaves them null, as a server with capture off).

    ``output_mode=None`` is the form of a release whose generate protocol has no
    ``output_mode`` (vLLM 0.30, read off a real server): choices ``{index, logprobs,
    finish_reason, token_ids, routed_experts, sampling_mask}``, ``"usage": null`` on token
    chunks, and a usage chunk without null fields."""
    if output_mode not in ("tokens", "text", None):
        raise ValueError(f"output_mode is 'tokens', 'text' or None; got {output_mode!r}")
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
            }
            if output_mode is not None:
                choice["stop_reason"] = completion.stop_reason if last else None
            choice["token_ids"] = piece
            choice["routed_experts"] = None if routes is None else encode_npy_base64(routes)
            choice["sampling_mask"] = None
            if output_mode is not None:
                choice["weight_versions"] = None
            if output_mode == "text":
                choice["text"] = ""
            chunk: dict[str, Any] = {"request_id": request_output.request_id}
            if output_mode is None:
                chunk.update(choices=[choice], usage=None)
            else:
                chunk.update(usage=None, output_mode=output_mode, choices=[choice])
            if first and return_token_ids:
                chunk["prompt_token_ids"] = list(request_output.prompt_token_ids)
            first = False
            events.append(_event(chunk))
    if include_usage:
        usage = _usage(request_output)
        last_chunk: dict[str, Any] = {"request_id": request_output.request_id}
        if output_mode is None:
            last_chunk.update(choices=[], usage=usage)
        else:
            last_chunk.update(usage=usage, output_mode=output_mode, choices=[])
        events.append(_event(last_chunk))
    events.append("data: [DONE]\n\n")
    return events


def _usage(request_output: Any) -> dict[str, int]:
    p = len(request_output.prompt_token_ids)
    g = sum(len(c.token_ids) for c in request_output.outputs)
    return {"prompt_tokens": p, "total_tokens": p + g, "completion_tokens": g}


def openai_stream(
    request_output: Any,
    *,
    chat: bool = False,
    chunk_tokens: int = 1,
    model: str = "rr-fakes",
    return_token_ids: bool = True,
    include_usage: bool = False,
) -> list[str]:
    """The SSE events of a streamed ``/v1/completions`` (or, ``chat``, ``/v1/chat/completions``)
    answer as vLLM 0.30's server sends it: no routes anywhere (the stream choices have no such
    field). Completions: every choice carries ``prompt_token_ids`` (the ids on the choice's
    first chunk, null after) and ``token_ids`` (null without ``return_token_ids``). Chat: a
    first chunk per choice with the assistant role and empty content (``prompt_token_ids`` on
    it, chunk-level, with ``return_token_ids``), then content chunks whose choices have
    ``token_ids`` only with ``return_token_ids`` and ``stop_reason`` only when finished.
    ``include_usage`` (``stream_options``) closes with a usage chunk (``choices: []``)."""
    events = []
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{request_output.request_id}"
    head = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": model,
    }
    prompt = list(request_output.prompt_token_ids)
    for completion in request_output.outputs:
        if chat:
            opening: dict[str, Any] = {
                **head,
                "choices": [
                    {
                        "index": completion.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if return_token_ids:
                opening.update(prompt_token_ids=prompt, prompt_text=None)
            events.append(_event(opening))
        pieces = _pieces(list(completion.token_ids), chunk_tokens)
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            finish = completion.finish_reason if last else None
            choice: dict[str, Any] = {"index": completion.index}
            if chat:
                choice.update(delta={"content": ""}, logprobs=None, finish_reason=finish)
                if last:
                    choice["stop_reason"] = completion.stop_reason
                if return_token_ids:
                    choice["token_ids"] = piece
            else:
                choice.update(
                    text="",
                    logprobs=None,
                    finish_reason=finish,
                    stop_reason=completion.stop_reason if last else None,
                    prompt_token_ids=prompt if n == 0 and return_token_ids else None,
                    token_ids=piece if return_token_ids else None,
                )
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if last and not include_usage:
                chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
            events.append(_event(chunk))
    if include_usage:
        usage: dict[str, Any] = {**head, "choices": [], "usage": _usage(request_output)}
        events.append(_event({**usage, "system_fingerprint": SYSTEM_FINGERPRINT}))
    events.append("data: [DONE]\n\n")
    return events
