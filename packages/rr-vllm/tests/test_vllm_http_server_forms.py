"""rr_fakes' emulation and rr_vllm's decoders against answers a real vLLM 0.30 server sent
(``vllm serve --enable-return-routed-experts --enable-scale-out`` on a tiny Qwen3-MoE: prompt
``[5, 6, 7, 8]``, three greedy tokens, uint8 routes ``[6, 4, 2]``), kept here verbatim so these
checks run without vllm (``tests/engine/test_engine_server.py`` runs the server itself).

What the real answers showed that rr had wrong: the OpenAI answers send ``token_ids`` and the
completion choice's ``prompt_token_ids`` as null unless the request sets ``return_token_ids``
(and a null choice field hid the ``prompt_token_ids`` passed to the decoder); chat and
``/inference/v1/generate`` send ``prompt_token_ids`` response-level, not in the choice;
0.30's generate stream has no ``output_mode`` and no ``stop_reason``; the OpenAI chat stream
opens with a role-only chunk carrying ``prompt_token_ids`` chunk-level.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rr_core import RouteMeta
from rr_fakes.emulations.engines import (
    decode_npy_base64,
    openai_stream,
    vllm_generate_response,
    vllm_generate_stream,
    vllm_http_response,
)
from rr_vllm import DecodeOptions, EngineOutputError, decode_vllm_http, decode_vllm_stream

META = RouteMeta(
    num_experts=8,
    top_k=2,
    layer_axis="all_layers",
    layer_numbers=(1, 2, 3, 4),
    moe_layer_numbers=(2, 3, 4),
)
PROMPT, TOKENS = [5, 6, 7, 8], [62, 59, 59]
ROUTES = (
    "k05VTVBZAQB2AHsnZGVzY3InOiAnfHUxJywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDYsIDQsIDIp"
    "LCB9ICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoAAAMAAwIDBAAA"
    "AAUDAgMCAAADAAIDAQMAAAUDAgEBAwAAAwUCAwMBAAAFAAIDAQY="
)
_USAGE = {
    "prompt_tokens": 4,
    "total_tokens": 7,
    "completion_tokens": 3,
    "prompt_tokens_details": None,
    "completion_tokens_details": None,
}
_TAIL = {"kv_transfer_params": None, "ec_transfer_params": None}
#: /v1/completions, no return_token_ids
REAL_COMPLETION = {
    "id": "cmpl-ba78cac85a9321b5", "object": "text_completion", "created": 1796198565,
    "model": "m", "choices": [{
        "index": 0, "text": " w62 w59 w59", "logprobs": None, "finish_reason": "length",
        "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
        "prompt_token_ids": None, "routed_experts": ROUTES,
    }],
    "service_tier": None, "system_fingerprint": "vllm-0.30.0-bc23d9a4", "usage": _USAGE,
    **_TAIL, "metrics": None,
}  # fmt: skip
#: /v1/chat/completions with return_token_ids
REAL_CHAT = {
    "id": "chatcmpl-828e773e74759e2e", "object": "chat.completion", "created": 1796198572,
    "model": "m", "choices": [{
        "index": 0, "message": {
            "role": "assistant", "content": " w62 w59 w59", "refusal": None,
            "annotations": None, "audio": None, "function_call": None, "reasoning": None,
        },
        "logprobs": None, "finish_reason": "length", "stop_reason": None,
        "token_ids": TOKENS, "routed_experts": ROUTES,
    }],
    "service_tier": None, "system_fingerprint": "vllm-0.30.0-bc23d9a4", "usage": _USAGE,
    "prompt_logprobs": None, "prompt_token_ids": PROMPT, "prompt_text": None, **_TAIL,
    "metrics": None,
}  # fmt: skip
#: /inference/v1/generate with return_token_ids
REAL_GENERATE = {
    "request_id": "generate-tokens-a571597622120b28", "model": "m", "created": 1796198578,
    "choices": [{
        "index": 0, "logprobs": None, "finish_reason": "length", "token_ids": TOKENS,
        "routed_experts": ROUTES, "sampling_mask": None,
    }],
    "usage": _USAGE, "prompt_logprobs": None, "prompt_token_ids": PROMPT,
    "mm_placeholders": None, **_TAIL,
}  # fmt: skip
_RID = "generate-tokens-a383072b0b658ad6"
#: /inference/v1/generate, stream=true, return_token_ids, stream_options.include_usage
REAL_GENERATE_STREAM = [
    {"request_id": _RID, "choices": [{"index": 0, "logprobs": None, "finish_reason": None,
     "token_ids": [62], "routed_experts": None, "sampling_mask": None}], "usage": None,
     "prompt_token_ids": PROMPT},
    {"request_id": _RID, "choices": [{"index": 0, "logprobs": None, "finish_reason": None,
     "token_ids": [59], "routed_experts": None, "sampling_mask": None}], "usage": None},
    {"request_id": _RID, "choices": [{"index": 0, "logprobs": None, "finish_reason": "length",
     "token_ids": [59], "routed_experts": ROUTES, "sampling_mask": None}], "usage": None},
    {"request_id": _RID, "choices": [],
     "usage": {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3}},
]  # fmt: skip
_CID = "chatcmpl-938190b1ae710fe9"
_HEAD = {"id": _CID, "object": "chat.completion.chunk", "created": 1796198572, "model": "m"}
#: /v1/chat/completions, stream=true, return_token_ids, stream_options.include_usage
REAL_CHAT_STREAM = [
    {**_HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
     "logprobs": None, "finish_reason": None}], "prompt_token_ids": PROMPT, "prompt_text": None},
    {**_HEAD, "choices": [{"index": 0, "delta": {"content": " w62 w59"}, "logprobs": None,
     "finish_reason": None, "token_ids": [62, 59]}]},
    {**_HEAD, "choices": [{"index": 0, "delta": {"content": " w59"}, "logprobs": None,
     "finish_reason": "length", "stop_reason": None, "token_ids": [59]}]},
    {**_HEAD, "choices": [], "usage": {"prompt_tokens": 4, "total_tokens": 7,
     "completion_tokens": 3}, "system_fingerprint": "vllm-0.30.0-bc23d9a4"},
]  # fmt: skip


def _output() -> Any:
    """The engine's RequestOutput behind the answers (duck-typed)."""
    completion = SimpleNamespace(
        index=0,
        text=" w62 w59 w59",
        token_ids=TOKENS,
        finish_reason="length",
        stop_reason=None,
        routed_experts=np.array(decode_npy_base64(ROUTES)),
    )
    return SimpleNamespace(request_id="r", prompt_token_ids=PROMPT, outputs=[completion])


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def _events(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _check(sample: Any) -> None:
    assert sample is not None
    np.testing.assert_array_equal(np.asarray(sample.valid_T), [True] * 6 + [False])
    rows = np.asarray(sample.routes_TLK)[:6]
    np.testing.assert_array_equal(rows, decode_npy_base64(ROUTES).astype(np.int64))


@pytest.mark.parametrize(
    ("real", "fake"),
    [
        (REAL_COMPLETION, lambda: vllm_http_response(_output(), return_token_ids=False)),
        (REAL_CHAT, lambda: vllm_http_response(_output(), chat=True)),
        (REAL_GENERATE, lambda: vllm_generate_response(_output())),
    ],
    ids=["completions", "chat", "generate"],
)
def test_the_emulated_answer_has_the_real_fields_in_order(real: Any, fake: Any) -> None:
    body = fake()
    assert json.dumps(_shape(body)) == json.dumps(_shape(real))  # same keys, order, types
    assert body["choices"][0]["routed_experts"] == ROUTES  # the same .npy bytes
    assert body["usage"] == real["usage"]


def test_the_default_completion_answer_needs_return_token_ids() -> None:
    for body in (REAL_COMPLETION, vllm_http_response(_output(), return_token_ids=False)):
        with pytest.raises(EngineOutputError, match="return_token_ids=true"):
            decode_vllm_http(body, DecodeOptions(meta=META))
        # the null choice field no longer hides the argument, and the advice says why it
        # is not enough: the generated tokens are unknown
        with pytest.raises(EngineOutputError, match="cannot replace them"):
            decode_vllm_http(body, DecodeOptions(meta=META), num_prompt_tokens=len(PROMPT))
    (sample,) = decode_vllm_http(vllm_http_response(_output()), DecodeOptions(meta=META))
    _check(sample)


@pytest.mark.parametrize("body", [REAL_CHAT, REAL_GENERATE], ids=["chat", "generate"])
def test_the_response_level_prompt_ids_place_the_routes(body: dict[str, Any]) -> None:
    (sample,) = decode_vllm_http(body, DecodeOptions(meta=META))
    _check(sample)


def test_the_generate_answer_without_prompt_ids_takes_them_from_the_caller() -> None:
    body = vllm_generate_response(_output(), return_token_ids=False)
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] == TOKENS
    (sample,) = decode_vllm_http(body, DecodeOptions(meta=META), num_prompt_tokens=len(PROMPT))
    _check(sample)


def test_the_emulated_generate_stream_is_the_real_one() -> None:
    events = vllm_generate_stream(_output(), include_usage=True, output_mode=None)
    fake = [json.loads(e[6:]) for e in events[:-1]]
    assert fake[1:] == [{**c, "request_id": "r"} for c in REAL_GENERATE_STREAM[1:]]
    assert fake[0] == {**REAL_GENERATE_STREAM[0], "request_id": "r"}


@pytest.mark.parametrize("form", ["text", "bytes", "lines"])
def test_a_whole_sse_body_decodes(form: str) -> None:
    text = _events(REAL_GENERATE_STREAM)
    stream: Any = {"text": text, "bytes": text.encode(), "lines": text.splitlines()}[form]
    (sample,) = decode_vllm_stream(stream, DecodeOptions(meta=META))
    _check(sample)


def test_the_emulated_chat_stream_is_the_real_one() -> None:
    events = openai_stream(_output(), chat=True, include_usage=True, chunk_tokens=2)
    fake = [json.loads(e[6:]) for e in events[:-1]]
    assert [_shape(c) for c in fake] == [_shape(c) for c in REAL_CHAT_STREAM]
    assert fake[0]["prompt_token_ids"] == PROMPT
    with pytest.raises(EngineOutputError, match="OpenAI streaming"):
        decode_vllm_stream(_events(REAL_CHAT_STREAM), DecodeOptions(meta=META))
