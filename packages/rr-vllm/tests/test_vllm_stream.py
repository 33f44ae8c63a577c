"""G5: streamed answers. ``/inference/v1/generate`` sends the routes on each choice's final
chunk (vLLM >= 0.24); the OpenAI streaming path drops them and is refused by name, as is any
finished stream without routes: never an empty route set."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rr_fakes.emulations.engines import Faults, openai_stream, vllm_generate_stream
from rr_vllm import DecodeOptions, EngineOutputError, RouteStoreEvictedError, decode_vllm_stream
from vllm_testing import META, streamed_output


def _check(sample: Any, routes: np.ndarray, p: int, g: int, start: int) -> None:
    t = p + g
    assert sample.routes_TLK.shape == (t, 4, 2)
    np.testing.assert_array_equal(sample.valid_T, (np.arange(t) >= start) & (np.arange(t) < t - 1))
    np.testing.assert_array_equal(sample.routes_TLK[start : t - 1], routes[start:])


@pytest.mark.parametrize("chunk_tokens", [1, 2, 5, 50])
@pytest.mark.parametrize("form", ["text", "lines", "bytes", "parsed"])
def test_final_chunk_routes_decode(chunk_tokens: int, form: str) -> None:
    out, routes = streamed_output(start=2)
    events = vllm_generate_stream(out, chunk_tokens=chunk_tokens, include_usage=True)
    stream: Any = {
        "text": ["".join(events)],
        "lines": [line for e in events for line in e.splitlines()],
        "bytes": [e.encode() for e in events],
        "parsed": [json.loads(e[6:]) for e in events[:-1]] + [events[-1]],
    }[form]
    (sample,) = decode_vllm_stream(stream, DecodeOptions(meta=META, prompt_start=2))
    _check(sample, routes, 6, 5, 2)


def test_prompt_ids_from_the_caller_and_text_mode() -> None:
    out, routes = streamed_output()
    events = vllm_generate_stream(out, return_token_ids=False, output_mode="text")
    with pytest.raises(EngineOutputError, match="return_token_ids"):
        decode_vllm_stream(events, DecodeOptions(meta=META))
    (sample,) = decode_vllm_stream(
        events, DecodeOptions(meta=META), num_prompt_tokens=len(list(range(10, 16)))
    )
    _check(sample, routes, 6, 5, 0)


def test_n_choices_share_the_first_chunks_prompt() -> None:
    out, routes = streamed_output(seed=1)
    other, routes_b = streamed_output(g=3, seed=2)
    second = other.outputs[0]
    second.index = 1
    out.outputs.append(second)
    a, b = decode_vllm_stream(vllm_generate_stream(out, chunk_tokens=2), DecodeOptions(meta=META))
    _check(a, routes, 6, 5, 0)
    _check(b, routes_b, 6, 3, 0)


@pytest.mark.parametrize("chat", [False, True])
def test_openai_streams_are_refused_by_name(chat: bool) -> None:
    out, _ = streamed_output()
    with pytest.raises(
        EngineOutputError, match=r"vLLM RFC #56745; see `rr explain G5`.*inference/v1/generate"
    ):
        decode_vllm_stream(openai_stream(out, chat=chat), DecodeOptions(meta=META))


def test_an_openai_chunk_without_its_object_is_refused_too() -> None:
    out, _ = streamed_output()
    chunks = [json.loads(e[6:]) for e in openai_stream(out)[:-1]]
    for c in chunks:
        del c["object"]
    with pytest.raises(EngineOutputError, match="OpenAI streaming choice"):
        decode_vllm_stream([*chunks, "data: [DONE]"], DecodeOptions(meta=META))


def test_a_finished_stream_without_routes_is_refused() -> None:
    out, _ = streamed_output()
    with pytest.raises(EngineOutputError, match="never returned"):
        decode_vllm_stream(vllm_generate_stream(out, drop_routes=True), DecodeOptions(meta=META))


def test_an_aborted_stream_is_masked_or_dropped() -> None:
    out, _ = streamed_output(faults=Faults(abort_after_rows=2))
    events = vllm_generate_stream(out, drop_routes=True)
    (masked,) = decode_vllm_stream(events, DecodeOptions(meta=META))
    assert masked is not None
    assert masked.aborted
    assert not masked.valid_T.any()
    assert list(decode_vllm_stream(events, DecodeOptions(meta=META, on_abort="drop"))) == [None]


@pytest.mark.parametrize("cut", ["no_done", "no_final"])
def test_a_cut_stream_is_refused(cut: str) -> None:
    out, _ = streamed_output()
    events = vllm_generate_stream(out)
    events = events[:-1] if cut == "no_done" else [*events[:-2], events[-1]]
    with pytest.raises(EngineOutputError, match="is cut"):
        decode_vllm_stream(events, DecodeOptions(meta=META))


def test_routes_before_the_final_chunk_are_refused() -> None:
    out, _ = streamed_output()
    chunks = [json.loads(e[6:]) for e in vllm_generate_stream(out)[:-1]]
    chunks[0]["choices"][0]["routed_experts"] = chunks[-1]["choices"][0]["routed_experts"]
    with pytest.raises(EngineOutputError, match="before the choice finished"):
        decode_vllm_stream([*chunks, "data: [DONE]"], DecodeOptions(meta=META))


def test_versions_before_0_24_stream_no_routes() -> None:
    out, routes = streamed_output()
    events = vllm_generate_stream(out)
    with pytest.raises(EngineOutputError, match=r"0\.24\.0"):
        decode_vllm_stream(events, DecodeOptions(meta=META, engine_version="0.23.0"))
    (sample,) = decode_vllm_stream(events, DecodeOptions(meta=META, engine_version="0.24.0"))
    _check(sample, routes, 6, 5, 0)


def test_an_error_event_raises_its_error() -> None:
    error = {
        "error": {"message": "BlockObjectStoreError: evicted", "type": "BlockObjectStoreError"}
    }
    with pytest.raises(RouteStoreEvictedError):
        decode_vllm_stream([f"data: {json.dumps(error)}", "data: [DONE]"], DecodeOptions(meta=META))
    with pytest.raises(EngineOutputError, match="not JSON"):
        decode_vllm_stream(["data: {oops", "data: [DONE]"], DecodeOptions(meta=META))
    with pytest.raises(EngineOutputError, match="SSE text"):
        decode_vllm_stream([42], DecodeOptions(meta=META))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.integers(1, 9),
    g=st.integers(1, 7),
    chunk_tokens=st.integers(1, 8),
    data=st.data(),
)
def test_any_stream_decodes_exactly_or_raises(
    p: int, g: int, chunk_tokens: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, p))
    out, routes = streamed_output(p, g, start)
    events = vllm_generate_stream(out, chunk_tokens=chunk_tokens)
    fault = data.draw(st.sampled_from(["none", "drop", "truncate_text", "flip"]))
    if fault == "drop":
        del events[data.draw(st.integers(0, len(events) - 1))]
    elif fault == "truncate_text":
        text = "".join(events)
        events = [text[: data.draw(st.integers(0, len(text) - 1))]]
    elif fault == "flip":  # a structural character: the base64 payload has no checksum
        text = "".join(events)
        payload = [range(*m.span(1)) for m in re.finditer(r'"routed_experts": "([^"]+)"', text)]
        outside = [i for i in range(len(text)) if not any(i in r for r in payload)]
        at = data.draw(st.sampled_from(outside))
        events = [text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]]
    try:
        (sample,) = decode_vllm_stream(events, DecodeOptions(meta=META, prompt_start=start))
    except EngineOutputError:
        assert fault != "none"
        return
    assert sample is not None
    _check(sample, routes, p, g, start)
