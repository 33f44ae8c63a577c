"""SGLang as each release sends it (emulated from the wheels' sglang/srt): ``/generate`` and
``Engine.generate`` ``meta_info``, the OpenAI-compatible ``sglext`` (non-streaming and streamed),
``routed_experts_start_len`` honoured (0.5.12+) or ignored (0.5.8-0.5.11), and the faults."""

from __future__ import annotations

import base64
import copy
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import AlignmentError, RouteMeta
from rr_fakes.emulations.engines import Faults, sglang_response
from rr_fakes.emulations.engines._wire import sglang_openai_response, sglang_openai_stream
from rr_fakes.pins import TESTED_SGLANG
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineOutputError,
    SampleRoutes,
    decode_sglang,
    decode_sglang_openai,
    decode_sglang_stream,
    sglang_flags,
    validate_samples,
)
from vllm_testing import META, distinct_routes

P, G = 6, 4
ROUTES = distinct_routes(META, P + G - 1, seed=3)
#: One release of each era (SGLANG_FEATURES): capture, start_len declared, OpenAI sglext,
#: tokenizer-manager encoding, detokenizer again, start_len honoured, chat meta_info, newest.
ERAS = ("0.5.7", "0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.19", "0.5.23")


def generate(version: str, start_len: int = 0, **kw: Any) -> dict[str, Any]:
    return sglang_response(
        prompt_ids=list(range(P)),
        generated_ids=list(range(100, 100 + G)),
        routes_TLK=kw.pop("routes", ROUTES),
        start_len=start_len,
        num_experts=META.num_experts,
        sglang_version=version,
        **kw,
    )


def assert_sample(s: SampleRoutes | None, start_len: int, routes: np.ndarray = ROUTES) -> None:
    """Rows [start_len, P+G-1) placed at their positions, every other row invalid."""
    assert s is not None
    n = routes.shape[0]
    np.testing.assert_array_equal(s.routes_TLK[start_len:n], routes[start_len:])
    want_T = np.zeros(P + G, dtype=bool)
    want_T[start_len:n] = True
    np.testing.assert_array_equal(s.valid_T, want_T)
    assert not s.routes_TLK[:start_len].any()
    assert s.prompt_start == start_len


def same(a: SampleRoutes | None, b: SampleRoutes | None) -> None:
    assert a is not None
    assert b is not None
    np.testing.assert_array_equal(a.routes_TLK, b.routes_TLK)
    np.testing.assert_array_equal(a.valid_T, b.valid_T)
    assert (a.prompt_start, a.num_prompt_tokens) == (b.prompt_start, b.num_prompt_tokens)


# --- version facts -------------------------------------------------------------------------------


def test_flags_per_release() -> None:
    table = {v: sglang_flags(v) for v in ERAS}
    assert [v for v in ERAS if table[v].start_len] == ["0.5.12", "0.5.13", "0.5.19", "0.5.23"]
    assert [v for v in ERAS if table[v].tensor_without_tokenizer] == ["0.5.7", "0.5.8", "0.5.9"]
    assert [v for v in ERAS if not table[v].openai_sglext] == ["0.5.7", "0.5.8"]
    assert [v for v in ERAS if table[v].chat_meta_info_only] == ["0.5.19", "0.5.23"]
    assert all(f.supported for f in table.values())
    assert sglang_flags("0.5.10.post1").tensor_without_tokenizer is False
    assert not sglang_flags("0.5.24").supported
    assert set(TESTED_SGLANG) <= set(ERAS)
    with pytest.raises(CaptureError, match=r"0\.5\.7"):
        sglang_flags("0.5.6.post2")


# --- /generate and Engine.generate ---------------------------------------------------------------


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("start_len", [0, 2, P])
def test_generate_decodes_alike_on_every_release(version: str, start_len: int) -> None:
    body = generate(version, start_len)
    s = decode_sglang(
        body, DecodeOptions(meta=META, prompt_start=start_len, engine_version=version)
    ).only()
    assert_sample(s, start_len)
    # without the version the row count tells an ignored start_len from an honoured one
    same(decode_sglang(body, DecodeOptions(meta=META, prompt_start=start_len)).only(), s)
    validate_samples([s], META)  # type: ignore[list-item]


@pytest.mark.parametrize("version", ["0.5.8", "0.5.11"])
def test_an_ignored_start_len_sends_every_row(version: str) -> None:
    body = generate(version, start_len=2)
    raw = base64.b64decode(body["meta_info"]["routed_experts"])
    assert len(raw) == ROUTES[..., :].size * 4  # rows [0, seqlen - 1): the field never arrived
    with pytest.raises(AlignmentError):  # 0.5.12+ would have cut them: a mislabelled version
        decode_sglang(
            body, DecodeOptions(meta=META, prompt_start=2, engine_version="0.5.12")
        ).only()


@pytest.mark.parametrize("version", ["0.5.7", "0.5.9"])
def test_engine_without_tokenizer_returns_the_tensor(version: str) -> None:
    body = generate(version, tokenizer=False)
    value = body["meta_info"]["routed_experts"]
    assert isinstance(value, torch.Tensor)
    assert value.dtype == torch.int32
    assert_sample(decode_sglang(body, DecodeOptions(meta=META, engine_version=version)).only(), 0)
    assert isinstance(generate("0.5.10", tokenizer=False)["meta_info"]["routed_experts"], str)


def test_a_streamed_generate_chunk_before_the_last_is_named() -> None:
    info = copy.deepcopy(generate("0.5.23")["meta_info"])
    del info["routed_experts"]
    info["finish_reason"] = None
    with pytest.raises(EngineOutputError, match="final chunk only"):
        decode_sglang(info, DecodeOptions(meta=META)).only()


# --- faults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.7", "0.5.11", "0.5.12", "0.5.23"])
def test_start_len_beyond_the_prompt_is_refused(version: str) -> None:
    body = generate(version, start_len=P + 1)
    with pytest.raises(EngineOutputError, match=r"beyond the prompt's 6 tokens"):
        decode_sglang(
            body, DecodeOptions(meta=META, prompt_start=P + 1, engine_version=version)
        ).only()
    with pytest.raises(EngineOutputError, match="beyond"):
        decode_sglang(body, DecodeOptions(meta=META, prompt_start=P + 1)).only()


def test_start_len_beyond_the_prompt_aborts_on_new_releases() -> None:
    finish = generate("0.5.12", start_len=P + 1)["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert "routed_experts_start_len" in finish["message"]


@pytest.mark.parametrize(("dtype", "name"), [(np.int64, "int64"), (np.int16, "int16")])
@pytest.mark.parametrize("start_len", [0, 3])
def test_another_item_size_is_named(dtype: type, name: str, start_len: int) -> None:
    body = generate("0.5.23", start_len)
    body["meta_info"]["routed_experts"] = base64.b64encode(
        ROUTES[start_len:].astype(dtype).tobytes()
    ).decode()
    with pytest.raises(EngineOutputError, match=f"{name}, where SGLang sends int32"):
        decode_sglang(
            body, DecodeOptions(meta=META, prompt_start=start_len, engine_version="0.5.23")
        ).only()


def test_uint8_rows_are_named() -> None:
    routes = distinct_routes(META, 4 * 5 - 1, seed=1)  # a row count that divides by four
    body = sglang_response(
        prompt_ids=list(range(15)), generated_ids=list(range(5)), routes_TLK=routes
    )
    body["meta_info"]["routed_experts"] = base64.b64encode(routes.astype(np.uint8)).decode()
    with pytest.raises(EngineOutputError, match="uint8"):
        decode_sglang(body, DecodeOptions(meta=META)).only()


def test_wrong_lengths() -> None:
    body = generate("0.5.23")
    raw = base64.b64decode(body["meta_info"]["routed_experts"])
    body["meta_info"]["routed_experts"] = base64.b64encode(raw[:-4]).decode()
    with pytest.raises(EngineOutputError, match="not a multiple"):
        decode_sglang(body, DecodeOptions(meta=META)).only()
    row = 4 * len(META.layer_numbers) * META.top_k
    body["meta_info"]["routed_experts"] = base64.b64encode(raw[:-row]).decode()
    with pytest.raises(AlignmentError):
        decode_sglang(body, DecodeOptions(meta=META)).only()


@pytest.mark.parametrize("version", ["0.5.7", "0.5.23"])
def test_missing_when_requested_is_d3(version: str) -> None:
    with pytest.raises(EngineOutputError, match="D3"):
        decode_sglang(
            generate(version, faults=Faults(missing=True)), DecodeOptions(meta=META)
        ).only()


def test_aborted_requests_are_masked_or_dropped() -> None:
    body = generate("0.5.23", faults=Faults(abort_after_rows=2))
    masked = decode_sglang(body, DecodeOptions(meta=META)).only()
    assert masked is not None
    assert not masked.valid_T.any()
    assert decode_sglang(body, DecodeOptions(meta=META, on_abort="drop")).only() is None


# --- OpenAI-compatible ----------------------------------------------------------------------------

OPENAI_ERAS = [v for v in ERAS if sglang_flags(v).openai_sglext]


@pytest.mark.parametrize("version", OPENAI_ERAS)
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("start_len", [0, 3])
def test_openai_sglext_decodes_as_generate(version: str, chat: bool, start_len: int) -> None:
    item = generate(version, start_len)
    body = sglang_openai_response([item], chat=chat, sglang_version=version)
    assert "routed_experts" not in body["choices"][0]
    assert body["sglext"]["routed_experts"] == item["meta_info"]["routed_experts"]
    (s,) = decode_sglang_openai(
        body, DecodeOptions(meta=META, prompt_start=start_len, engine_version=version)
    )
    same(s, decode_sglang(item, DecodeOptions(meta=META, prompt_start=start_len)).only())
    assert_sample(s, start_len)


@pytest.mark.parametrize("version", ["0.5.7", "0.5.8"])
def test_openai_answers_before_0_5_9_carry_no_routes(version: str) -> None:
    body = sglang_openai_response([generate(version)], sglang_version=version)
    assert "sglext" not in body
    with pytest.raises(EngineOutputError, match=r"0\.5\.9.*D3"):
        decode_sglang_openai(body, DecodeOptions(meta=META, engine_version=version))


@pytest.mark.parametrize("version", ["0.5.13", "0.5.19", "0.5.23"])
def test_chat_meta_info_gives_each_choice_its_routes(version: str) -> None:
    other = distinct_routes(META, P + G - 1, seed=9)
    items = [generate(version), generate(version, routes=other)]
    body = sglang_openai_response(items, chat=True, return_meta_info=True, sglang_version=version)
    assert ("sglext" in body) is (not sglang_flags(version).chat_meta_info_only)
    a, b = decode_sglang_openai(body, DecodeOptions(meta=META, engine_version=version))
    assert_sample(a, 0)
    assert_sample(b, 0, other)


def test_n_above_one_without_meta_info_is_refused() -> None:
    items = [generate("0.5.23"), generate("0.5.23")]
    body = sglang_openai_response(items, sglang_version="0.5.23")
    with pytest.raises(EngineOutputError, match="first choice only"):
        decode_sglang_openai(body, DecodeOptions(meta=META))


def test_openai_faults() -> None:
    body = sglang_openai_response([generate("0.5.23")])
    missing = copy.deepcopy(body)
    del missing["sglext"]
    with pytest.raises(EngineOutputError, match=r"no sglext\.routed_experts.*D3"):
        decode_sglang_openai(missing, DecodeOptions(meta=META))
    no_usage = copy.deepcopy(body)
    del no_usage["usage"]
    with pytest.raises(EngineOutputError, match="num_prompt_tokens and num_generated_tokens"):
        decode_sglang_openai(no_usage, DecodeOptions(meta=META))
    (s,) = decode_sglang_openai(
        no_usage, DecodeOptions(meta=META), num_prompt_tokens=P, num_generated_tokens=G
    )
    assert_sample(s, 0)
    with pytest.raises(EngineOutputError, match="beyond"):
        decode_sglang_openai(body, DecodeOptions(meta=META, prompt_start=P + 1))
    with pytest.raises(EngineOutputError, match="'choices' is empty"):
        decode_sglang_openai({**body, "choices": []}, DecodeOptions(meta=META))
    with pytest.raises(EngineOutputError, match="sglext"):
        decode_sglang_openai({**body, "sglext": "abc"}, DecodeOptions(meta=META))


# --- streamed OpenAI ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.9", "0.5.11", "0.5.23"])
@pytest.mark.parametrize("chat", [False, True])
def test_stream_routes_chunk_decodes_as_generate(version: str, chat: bool) -> None:
    item = generate(version, 2)
    chunks: list[Any] = [*sglang_openai_stream(item, chat=chat, sglang_version=version), "[DONE]"]
    assert chunks[-3]["choices"] == []
    assert "routed_experts" in chunks[-3]["sglext"]
    s = decode_sglang_stream(
        chunks, DecodeOptions(meta=META, prompt_start=2, engine_version=version)
    ).only()
    same(s, decode_sglang(item, DecodeOptions(meta=META, prompt_start=2)).only())


def test_stream_faults() -> None:
    item = generate("0.5.23")
    chunks = sglang_openai_stream(item)
    with pytest.raises(EngineOutputError, match=r"no chunk with sglext\.routed_experts.*D3"):
        decode_sglang_stream(
            [c for c in chunks if "sglext" not in c], DecodeOptions(meta=META)
        ).only()
    with pytest.raises(EngineOutputError, match="cut before its end"):
        decode_sglang_stream(chunks[:1], DecodeOptions(meta=META)).only()
    bare = sglang_openai_stream(item, include_usage=False)
    with pytest.raises(EngineOutputError, match="include_usage"):
        decode_sglang_stream(bare, DecodeOptions(meta=META)).only()
    assert_sample(
        decode_sglang_stream(
            bare, DecodeOptions(meta=META), num_prompt_tokens=P, num_generated_tokens=G
        ).only(),
        0,
    )
    routes_chunk = next(c for c in chunks if "sglext" in c)
    with pytest.raises(EngineOutputError, match="2 chunks carry"):
        decode_sglang_stream([*chunks, routes_chunk], DecodeOptions(meta=META)).only()
    two = copy.deepcopy(chunks)
    two[0]["choices"][0]["index"] = 1
    with pytest.raises(EngineOutputError, match="first choice only"):
        decode_sglang_stream(two, DecodeOptions(meta=META)).only()
    with pytest.raises(EngineOutputError, match=r"json\.loads"):
        decode_sglang_stream(['data: {"id": 1}'], DecodeOptions(meta=META)).only()
    aborted = sglang_openai_stream(generate("0.5.23", faults=Faults(abort_after_rows=1)))
    assert decode_sglang_stream(aborted, DecodeOptions(meta=META, on_abort="drop")).only() is None


# --- property: every release, start_len and length decode to the engine's rows -----------------


def _meta() -> RouteMeta:
    return META


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    version=st.sampled_from(ERAS),
    p=st.integers(1, 12),
    g=st.integers(1, 8),
    data=st.data(),
)
def test_every_release_and_start_len_round_trip(
    version: str, p: int, g: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, p))
    routes = distinct_routes(META, p + g - 1, seed=p * 31 + g)
    item = sglang_response(
        prompt_ids=list(range(p)),
        generated_ids=list(range(g)),
        routes_TLK=routes,
        start_len=start,
        sglang_version=version,
    )
    for known in (version, None):
        s = decode_sglang(
            item, DecodeOptions(meta=_meta(), prompt_start=start, engine_version=known)
        ).only()
        assert s is not None
        np.testing.assert_array_equal(s.routes_TLK[start : p + g - 1], routes[start:])
        assert s.valid_T.sum() == p + g - 1 - start
