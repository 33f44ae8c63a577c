"""Routes on the wire: vLLM's HTTP base64 ``.npy`` strings and SGLang's ``meta_info``.

What it mirrors (``vllm-facts.md``):

- vLLM ``/v1/completions``, ``/v1/chat/completions`` and ``/inference/v1/generate``
  (non-streaming, read off a real vLLM 0.30 server): ``choices[i].routed_experts`` is the base64
  of a ``.npy`` file written with ``np.save(..., allow_pickle=False)``; None when the request
  aborted before any forward or capture is off. The OpenAI answers' ``token_ids`` are null
  unless the request sets ``return_token_ids``; chat and generate send ``prompt_token_ids``
  response-level (the completion choices carry it themselves).
- SGLang (0.5.7 to 0.5.23, read in each wheel's sglang/srt): ``meta_info["routed_experts"]`` is
  the base64 of raw int32 bytes in C order with **no shape header**; ``np.frombuffer`` gives a
  read-only flat array to reshape as ``(-1, num_hidden_layers, num_experts_per_tok)``; rows cover
  ``[start_len, seqlen - 1)`` from 0.5.12 (``[0, seqlen - 1)`` before). The OpenAI-compatible
  answers (0.5.9+) carry the first choice's string in the response-level ``sglext``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rr_fakes.emulations.engines._faults import NO_FAULTS, Faults, IntArray, faulted_rows, finish
from rr_fakes.emulations.engines._vllm import as_routes


def encode_npy_base64(array: np.ndarray) -> str:
    """vLLM's HTTP form of one routes array."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_npy_base64(text: str) -> np.ndarray:
    """The inverse of :func:`encode_npy_base64` (what a client does)."""
    array: np.ndarray = np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)
    return array


#: What the emulated server names itself (``system_fingerprint``: vLLM's release and a hash).
SYSTEM_FINGERPRINT = "vllm-0.30.0-rr-fakes"


def _usage(request_output: Any, *, details: bool = True) -> dict[str, Any]:
    p = len(request_output.prompt_token_ids)
    g = sum(len(c.token_ids) for c in request_output.outputs)
    usage: dict[str, Any] = {"prompt_tokens": p, "total_tokens": p + g, "completion_tokens": g}
    if details:  # null unless --enable-prompt-tokens-details (and reasoning counts)
        usage.update(prompt_tokens_details=None, completion_tokens_details=None)
    return usage


def _routes(completion: Any) -> str | None:
    routes = completion.routed_experts
    return None if routes is None else encode_npy_base64(routes)


def vllm_http_response(
    request_output: Any,
    *,
    model: str = "rr-fakes",
    return_token_ids: bool = True,
    chat: bool = False,
) -> dict[str, Any]:
    """The JSON body of a non-streaming ``/v1/completions`` (``chat=True``:
    ``/v1/chat/completions``) answer for ``request_output`` (built by
    :func:`vllm_request_output`), field for field as vLLM 0.30's server sends it.

    ``routed_experts`` is in every choice (the server's ``--enable-return-routed-experts``; no
    request field asks for it). ``return_token_ids`` is the request field: without it the
    choices' ``token_ids`` (and the completion choices' ``prompt_token_ids``) are null. Chat
    sends ``prompt_token_ids`` once, response-level, and its choices have a ``message``.
    """
    choices = []
    for completion in request_output.outputs:
        tokens = list(completion.token_ids) if return_token_ids else None
        choice: dict[str, Any] = {"index": completion.index}
        if chat:
            choice["message"] = {
                "role": "assistant", "content": completion.text, "refusal": None,
                "annotations": None, "audio": None, "function_call": None, "reasoning": None,
            }  # fmt: skip
            choice.update(
                logprobs=None,
                finish_reason=completion.finish_reason or "stop",
                stop_reason=completion.stop_reason,
                token_ids=tokens,
            )
        else:
            choice.update(
                text=completion.text,
                logprobs=None,
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
                token_ids=tokens,
                prompt_logprobs=None,
                prompt_token_ids=(
                    list(request_output.prompt_token_ids) if return_token_ids else None
                ),
            )
        choice["routed_experts"] = _routes(completion)
        choices.append(choice)
    body: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_output.request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(request_output),
    }
    if chat:
        body["prompt_logprobs"] = None
        body["prompt_token_ids"] = (
            list(request_output.prompt_token_ids) if return_token_ids else None
        )
        body["prompt_text"] = None
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return body


def vllm_generate_response(
    request_output: Any, *, model: str = "rr-fakes", return_token_ids: bool = True
) -> dict[str, Any]:
    """The JSON body of a non-streaming ``/inference/v1/generate`` answer (vLLM 0.30, served
    with ``--enable-scale-out``): every choice carries its ``token_ids`` and routes; the
    prompt's ids come response-level, and only with ``return_token_ids``."""
    choices = [
        {
            "index": c.index,
            "logprobs": None,
            "finish_reason": c.finish_reason or "stop",
            "token_ids": list(c.token_ids),
            "routed_experts": _routes(c),
            "sampling_mask": None,
        }
        for c in request_output.outputs
    ]
    return {
        "request_id": str(request_output.request_id),
        "model": model,
        "created": 0,
        "choices": choices,
        "usage": _usage(request_output),
        "prompt_logprobs": None,
        "prompt_token_ids": list(request_output.prompt_token_ids) if return_token_ids else None,
        "mm_placeholders": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def _start_len_honoured(sglang_version: str) -> bool:
    # routed_experts_start_len reaches the scheduler from 0.5.12 (sgl-project/sglang #24851)
    return release_of(sglang_version) >= (0, 5, 12)


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
    sglang_version: str = "0.5.23",
    tokenizer: bool = True,
    wire_dtype: str | None = None,
) -> dict[str, Any]:
    """SGLang's ``/generate`` answer with ``return_routed_experts`` (all hidden layers), as
    ``sglang_version`` sends it.

    ``routes_TLK`` holds ``P+G-1`` rows; ``start_len`` is ``routed_experts_start_len``: 0.5.12+
    returns rows ``[start_len, P+G-1)`` and aborts a request whose start_len is beyond P
    (scheduler.py), older releases ignore the field. ``tokenizer=False`` is ``Engine.generate``
    with ``skip_tokenizer_init``: 0.5.7-0.5.9 put the int32 tensor itself in ``meta_info``
    (only the detokenizer encoded). ``faults.missing`` leaves the key out (capture off on the
    server); ``num_experts`` is needed only to draw a seeded ``faults.draft_layer0``.
    ``wire_dtype`` (``"uint8"``, ``"uint16"``): narrow ids with ``routed_experts_dtype`` in
    ``meta_info``, as sglang PR #31219 (open, in no release) proposes.
    """
    p, g = len(prompt_ids), len(generated_ids)
    routes = as_routes(routes_TLK)
    if g < 1 or routes.shape[0] != p + g - 1:
        raise ValueError(f"routes have {routes.shape[0]} rows; P+G-1 = {p + g - 1}")
    honoured = _start_len_honoured(sglang_version)
    if start_len < 0:
        raise ValueError(f"routed_experts_start_len={start_len} < 0")
    first = start_len if honoured else 0
    rows = faulted_rows(routes, faults, first, num_experts)
    reason: dict[str, Any] = {"type": "abort" if faults.aborted else finish_reason}
    if start_len > p and honoured:
        reason = {
            "type": "abort",
            "message": f"req.routed_experts_start_len={start_len} is higher than the number of "
            f"input tokens len(req.origin_input_ids)={p}. Please use a smaller "
            "routed_experts_start_len.",
            "status_code": 400,
        }
    elif reason["type"] == "length":
        reason["length"] = g
    meta: dict[str, Any] = {
        "id": "0",
        "finish_reason": reason,
        "prompt_tokens": p,
        "completion_tokens": g,
        "cached_tokens": cached_tokens,
    }
    if not faults.missing and not (start_len > p and honoured):
        dtype = np.dtype(np.int32 if wire_dtype is None else wire_dtype).newbyteorder("<")
        raw = finish(rows, dtype, Faults(uint8_overflow=faults.uint8_overflow))
        if wire_dtype is not None:
            meta["routed_experts_dtype"] = wire_dtype
        if tokenizer or release_of(sglang_version) >= (0, 5, 10):
            # pybase64.b64encode(tensor.numpy().tobytes()), native (little-endian) int32
            meta["routed_experts"] = base64.b64encode(raw.tobytes(order="C")).decode("ascii")
        else:
            meta["routed_experts"] = torch.from_numpy(np.ascontiguousarray(raw))
    return {"text": "", "output_ids": list(generated_ids), "meta_info": meta}


def release_of(sglang_version: str) -> tuple[int, ...]:
    """``'0.5.10.post1'`` as ``(0, 5, 10)``."""
    return tuple(int(x) for x in sglang_version.split(".")[:3])


def _finish_type(item: dict[str, Any]) -> str | None:
    finish_ = item["meta_info"]["finish_reason"]
    return None if finish_ is None else str(finish_["type"])


def sglang_openai_response(
    items: Sequence[dict[str, Any]],
    *,
    chat: bool = False,
    return_meta_info: bool = False,
    sglang_version: str = "0.5.23",
    model: str = "rr-fakes",
) -> dict[str, Any]:
    """The non-streaming ``/v1/completions`` (or ``chat=True``: ``/v1/chat/completions``) answer
    for the ``/generate`` results ``items`` (one per choice), as serving_completions.py /
    serving_chat.py build it: the routes of ``items[0]`` alone in the response-level
    ``sglext.routed_experts`` (0.5.9+; none before), and with chat ``return_meta_info`` (0.5.13+)
    each item's whole ``meta_info`` in its choice (0.5.19+ then leave sglext's routes out)."""
    release = release_of(sglang_version)
    per_choice = chat and return_meta_info and release >= (0, 5, 13)
    choices = []
    for i, item in enumerate(items):
        choice: dict[str, Any] = {"index": i, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": item["text"]}
        else:
            choice["text"] = item["text"]
        choice["finish_reason"] = _finish_type(item)
        choice["matched_stop"] = None
        if per_choice:
            choice["meta_info"] = item["meta_info"]
        choices.append(choice)
    p = items[0]["meta_info"]["prompt_tokens"]
    g = sum(item["meta_info"]["completion_tokens"] for item in items)
    body: dict[str, Any] = {
        "id": items[0]["meta_info"]["id"],
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g},
        "metadata": None,
    }
    routes = items[0]["meta_info"].get("routed_experts")
    if per_choice and release >= (0, 5, 19):
        routes = None
    if routes is not None and release >= (0, 5, 9):
        body["sglext"] = {"routed_experts": routes}
    return body


def sglang_openai_stream(
    item: dict[str, Any],
    *,
    chat: bool = False,
    include_usage: bool = True,
    sglang_version: str = "0.5.23",
    model: str = "rr-fakes",
) -> list[dict[str, Any]]:
    """The ``data:`` chunks (parsed) of a streamed OpenAI answer for one ``/generate`` result:
    a chunk per generated token, the last with its finish_reason, then (0.5.9+, routes
    requested) one chunk with ``choices: []`` and ``sglext.routed_experts``, then the usage
    chunk when ``include_usage`` (stream_options)."""
    info = item["meta_info"]
    rid, obj = info["id"], "chat.completion.chunk" if chat else "text_completion"
    g = info["completion_tokens"]
    chunks = []
    for t in range(g):
        last = t == g - 1
        choice: dict[str, Any] = {"index": 0, "logprobs": None}
        if chat:
            choice["delta"] = {"role": "assistant" if t == 0 else None, "content": "x"}
        else:
            choice["text"] = "x"
        choice["finish_reason"] = _finish_type(item) if last else None
        choice["matched_stop"] = None
        chunks.append({"id": rid, "object": obj, "created": 0, "model": model, "choices": [choice]})
    routes = info.get("routed_experts")
    if routes is not None and release_of(sglang_version) >= (0, 5, 9):
        chunks.append(
            {
                "id": rid,
                "object": obj,
                "created": 0,
                "model": model,
                "choices": [],
                "sglext": {"routed_experts": routes},
            }
        )
    if include_usage:
        p = info["prompt_tokens"]
        usage = {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g}
        chunks.append(
            {"id": rid, "object": obj, "created": 0, "model": model, "choices": [], "usage": usage}
        )
    return chunks


def decode_sglang_routes(text: str, num_layers: int, top_k: int) -> IntArray:
    """What a client does with SGLang's string: a read-only ``[N, L, K]`` int32 view."""
    flat = np.frombuffer(base64.b64decode(text), dtype=np.int32)
    return flat.reshape(-1, num_layers, top_k)
