"""One decoder shape: every decoder takes a DecodeOptions (or a meta the keywords complete), the
two forms decode alike, a keyword a decoder does not read is refused, and an output that has not
finished is named unfinished rather than blamed on capture."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rr_core import AlignmentError
from rr_fakes.emulations.engines import sglang_response, vllm_http_response, vllm_request_output
from rr_vllm import (
    DecodeOptions,
    DecodeOptionsError,
    EngineOutputError,
    SampleRoutes,
    decode_r3v1,
    decode_routes_array,
    decode_sglang,
    decode_trtllm_output,
    decode_trtllm_routes,
    decode_vllm_batch,
    decode_vllm_http,
    decode_vllm_output,
)
from vllm_testing import META, distinct_routes, make_meta

P, G, START = 5, 3, 2


def _request(prompt_start: int = START, finish_reason: str = "length") -> Any:
    routes = distinct_routes(META, P + G - 1, seed=3)
    return vllm_request_output(
        "0.22-0.31",
        prompt_ids=range(P),
        generated_ids=range(100, 100 + G),
        routes_TLK=routes,
        num_experts=META.num_experts,
        prompt_start=prompt_start,
        finish_reason=finish_reason,
        engine_version="0.30.0",
    )


def _same(a: SampleRoutes | None, b: SampleRoutes | None) -> None:
    assert a is not None
    assert b is not None
    assert np.array_equal(a.routes_TLK, b.routes_TLK)
    assert np.array_equal(a.valid_T, b.valid_T)
    assert (a.prompt_start, a.finish_reason) == (b.prompt_start, b.finish_reason)


def test_the_options_object_and_the_keywords_decode_alike() -> None:
    options = DecodeOptions(meta=META, prompt_start=START, engine_version="0.30.0")
    out = _request()
    (by_object,) = decode_vllm_output(out, options)
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        (by_keywords,) = decode_vllm_output(out, META, prompt_start=START)
    _same(by_object, by_keywords)
    assert by_object is not None
    assert not by_object.valid_T[:START].any()
    http = vllm_http_response(out)
    _same(decode_vllm_http(http, options)[0], by_keywords)
    with pytest.warns(DeprecationWarning, match=r"prompt_start=, engine_version="):
        by_alias = decode_vllm_http(http, META, prompt_start=START, vllm_version="0.30.0")
    _same(by_alias[0], by_keywords)
    with pytest.warns(DeprecationWarning, match=r"decode_vllm_batch.*\.to_batch\(\)"):
        batch = decode_vllm_batch([out], options)
    assert np.array_equal(batch.valid_N.numpy(), by_keywords.valid_T)


def test_keywords_on_top_of_an_options_object_replace_its_fields() -> None:
    options = DecodeOptions(meta=META)
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        (sample,) = decode_vllm_output(_request(), options, prompt_start=START)
    assert sample is not None
    assert sample.prompt_start == START
    assert options.prompt_start == 0  # frozen: the call's options are a copy
    aborted = _request(finish_reason="abort")
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, on_abort="):
        assert decode_vllm_output(aborted, options, on_abort="drop") == [None]


def test_sglang_start_len_is_the_options_prompt_start() -> None:
    routes = distinct_routes(META, P + G - 1, seed=4)
    answer = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, start_len=START
    )
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        by_alias = decode_sglang(answer, META, start_len=START)
    by_object = decode_sglang(answer, DecodeOptions(meta=META, prompt_start=START)).only()
    _same(by_alias, by_object)
    assert by_alias is not None
    assert by_alias.prompt_start == START


@pytest.mark.filterwarnings("ignore:.*goes in the next release:DeprecationWarning")
def test_a_keyword_the_decoder_does_not_read_is_refused() -> None:
    with pytest.raises(DecodeOptionsError, match=r"decode_vllm_output\(\) does not read start_len"):
        decode_vllm_output(_request(), META, start_len=START)
    with pytest.raises(DecodeOptionsError, match="does not read promt_start"):
        decode_vllm_output(_request(), META, promt_start=START)  # type: ignore[call-arg]
    with pytest.raises(TypeError):  # DecodeOptionsError is a TypeError, as Python's own
        decode_r3v1("", META, num_prompt_tokens=1, num_generated_tokens=1, prompt_start=1)
    with pytest.raises(DecodeOptionsError, match=r"DecodeOptions or an rr_core\.RouteMeta"):
        decode_vllm_output(_request(), {"num_experts": 8})  # type: ignore[arg-type]


def test_trtllm_refuses_an_options_prompt_start() -> None:
    """TensorRT-LLM's rows start at token 0: a rollout's options with a prompt start would be
    ignored, so they are refused."""
    rows = distinct_routes(META, P + G - 1, seed=1)[:, list(META.moe_slots)]
    options = DecodeOptions(meta=META, prompt_start=START)
    with pytest.raises(DecodeOptionsError, match="no prompt_start"):
        decode_trtllm_routes(rows, options, num_prompt_tokens=P, num_generated_tokens=G)
    output = SimpleNamespace(
        prompt_token_ids=list(range(P)),
        outputs=[
            SimpleNamespace(token_ids=list(range(G)), finish_reason="stop", routed_experts=rows)
        ],
    )
    (sample,) = decode_trtllm_output(output, dataclasses.replace(options, prompt_start=0))
    assert sample is not None
    assert sample.valid_T.tolist() == [True] * (P + G - 1) + [False]


def test_a_batch_masks_aborted_requests_and_refuses_drop() -> None:
    with (
        pytest.warns(DeprecationWarning, match="decode_vllm_batch"),
        pytest.raises(EngineOutputError, match="masks aborted requests"),
    ):
        decode_vllm_batch([_request()], DecodeOptions(meta=META, on_abort="drop"))


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("prompt_start", -1, EngineOutputError),
        ("prompt_start", 1.0, EngineOutputError),
        ("on_abort", "skip", EngineOutputError),
        ("validate", 1, DecodeOptionsError),
        ("logical_experts", -2, EngineOutputError),
    ],
)
def test_options_are_checked_when_built(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=field.split("_")[0]):
        DecodeOptions(meta=META, **{field: value})


def test_options_name_the_meta_facts_the_decoders_share() -> None:
    options = DecodeOptions(meta=make_meta(num_experts=300, dense=(2,), layers=3, top_k=4))
    assert (options.layer_slots, options.top_k, options.moe_slots) == (3, 4, [0, 2])
    assert options.id_dtype == np.int16  # rr_core's narrowest dtype for 300 experts


def test_the_row_rule_is_rr_cores_in_every_decoder() -> None:
    """T - prompt_start rows from prompt_start > 0 (a G4 answer) are refused by the array
    decoder as by rr_core.align_routes: never read one row late."""
    g4 = distinct_routes(META, P + G - START, seed=2)
    with pytest.raises(AlignmentError, match="G4"):
        decode_routes_array(
            g4,
            DecodeOptions(meta=META, prompt_start=START),
            num_prompt_tokens=P,
            num_generated_tokens=G,
        )


@pytest.mark.parametrize("finish_reason", [None, "stop"])
def test_an_unfinished_output_is_named_unfinished(finish_reason: str | None) -> None:
    """No routes on an output whose finish_reason is None: the request has not finished (an
    offline LLMEngine abort leaves only such outputs), which capture being off does not explain;
    a finished one without routes is D3."""
    completion = SimpleNamespace(
        index=0, token_ids=[21, 22], finish_reason=finish_reason, routed_experts=None
    )
    output = SimpleNamespace(request_id="r", prompt_token_ids=[1, 2, 3], outputs=[completion])
    with pytest.raises(EngineOutputError) as info:
        list(decode_vllm_output(output, DecodeOptions(meta=META)))
    message = str(info.value)
    if finish_reason is None:
        assert "has not finished" in message
        assert "capture is off" not in message
    else:
        assert "capture is off" in message
        assert "D3" in message
