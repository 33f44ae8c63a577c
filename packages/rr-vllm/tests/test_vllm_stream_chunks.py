"""A streamed answer as an HTTP client yields it: byte chunks cut anywhere, mid-event,
mid-line and mid-UTF-8 character (``iter_content``, ``aiter_bytes``), decode as the whole body
does; a cut body is still refused. vLLM 0.34's ``output_mode="derender"`` answers without
token ids (``include_reasoning=false``) are refused by name in the HTTP and stream decoders,
and decode as the token answers do where they carry the token ids."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from rr_fakes.emulations.engines import vllm_generate_response, vllm_generate_stream
from rr_vllm import DecodeOptions, EngineOutputError, decode_vllm_http, decode_vllm_stream
from vllm_testing import META, streamed_output


def body_bytes(**kw: Any) -> tuple[bytes, np.ndarray]:
    """A streamed /inference/v1/generate body whose text choices hold multi-byte characters
    (two- to four-byte UTF-8), with a comment line, as a server may send keep-alives."""
    out, routes = streamed_output(start=2)
    events = []
    for event in vllm_generate_stream(out, output_mode="text", include_usage=True, **kw):
        if event.startswith("data: {"):
            chunk = json.loads(event[6:])
            for c in chunk["choices"]:
                c["text"] = "é€😀"
            event = "data: " + json.dumps(chunk, ensure_ascii=False) + "\n\n"
        events.append(event)
    return (": keep-alive ü\n\n" + "".join(events)).encode(), routes


def decoded(stream: Any) -> Any:
    (sample,) = decode_vllm_stream(stream, DecodeOptions(meta=META, prompt_start=2))
    return sample


def test_every_single_cut_of_the_byte_stream_decodes_alike() -> None:
    raw, routes = body_bytes(chunk_tokens=2)
    assert len(raw) != len(raw.decode())  # multi-byte characters to cut through
    whole = decoded([raw])
    np.testing.assert_array_equal(whole.routes_TLK[2:10], routes[2:])
    for cut in range(1, len(raw)):
        sample = decoded([raw[:cut], raw[cut:]])
        np.testing.assert_array_equal(sample.routes_TLK, whole.routes_TLK)
        np.testing.assert_array_equal(sample.valid_T, whole.valid_T)


@pytest.mark.parametrize("seed", range(12))
def test_random_byte_chunks_and_text_chunks_decode_alike(seed: int) -> None:
    raw, _ = body_bytes(chunk_tokens=1 + seed % 3)
    whole = decoded([raw])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(raw)), k=min(len(raw) - 1, 1 + seed * 7)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    np.testing.assert_array_equal(decoded(pieces).routes_TLK, whole.routes_TLK)
    text = raw.decode()  # iter_text: str chunks, cut anywhere between characters
    points = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, 1 + seed * 5)))
    parts = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    np.testing.assert_array_equal(decoded(parts).routes_TLK, whole.routes_TLK)
    lines = raw.splitlines()  # iter_lines: bytes lines without their line ends
    np.testing.assert_array_equal(decoded(lines).routes_TLK, whole.routes_TLK)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_a_body_cut_short_is_refused_in_chunks_too(keep: float) -> None:
    raw, _ = body_bytes(chunk_tokens=1)
    short = raw[: int(len(raw) * keep)]
    with pytest.raises(EngineOutputError, match=r"cut|not JSON|UTF-8"):
        decoded([short[i : i + 7] for i in range(0, len(short), 7)])


def test_a_body_cut_inside_a_utf8_character_is_refused() -> None:
    raw, _ = body_bytes(chunk_tokens=1)
    at = raw.index("€".encode()) + 1
    with pytest.raises(EngineOutputError, match=r"UTF-8"):
        decoded([raw[:at]])


def derender(chunk: dict[str, Any], hide: bool) -> dict[str, Any]:
    """A chunk (or body) as vLLM 0.34's output_mode='derender' sends it: each choice a parsed
    message (``delta`` streamed), token ids null under include_reasoning=false."""
    out = json.loads(json.dumps(chunk)) | {"output_mode": "derender"}
    for c in out["choices"]:
        c.pop("text", None)
        c["delta" if "message" not in c else "message"] = {"content": "hi"}
        if hide:
            c["token_ids"] = None
    return out


@pytest.mark.parametrize("hide", [True, False])
def test_a_derender_stream_without_token_ids_is_refused_by_name(hide: bool) -> None:
    out, routes = streamed_output(start=2)
    events = vllm_generate_stream(out, output_mode="tokens", include_usage=True)
    chunks: list[Any] = [json.loads(e[6:]) for e in events[:-1]]
    stream = [derender(c, hide) if c["choices"] else c for c in chunks] + ["data: [DONE]"]
    prompt = list(range(10, 16))
    if hide:
        with pytest.raises(EngineOutputError, match=r"output_mode='derender'.*include_reasoning"):
            decode_vllm_stream(
                stream, DecodeOptions(meta=META, prompt_start=2), num_prompt_tokens=len(prompt)
            )
    else:
        (sample,) = decode_vllm_stream(
            stream, DecodeOptions(meta=META, prompt_start=2), num_prompt_tokens=len(prompt)
        )
        np.testing.assert_array_equal(sample.routes_TLK[2:10], routes[2:])


@pytest.mark.parametrize("hide", [True, False])
def test_a_derender_answer_without_token_ids_is_refused_by_name(hide: bool) -> None:
    out, routes = streamed_output()
    body = vllm_generate_response(out)
    answer = derender(body, hide)
    for c in answer["choices"]:
        c["message"] = c.pop("delta")
    if hide:
        with pytest.raises(EngineOutputError, match=r"output_mode='derender'.*include_reasoning"):
            decode_vllm_http(answer, DecodeOptions(meta=META))
    else:
        (sample,) = decode_vllm_http(answer, DecodeOptions(meta=META))
        np.testing.assert_array_equal(sample.routes_TLK[:10], routes)
