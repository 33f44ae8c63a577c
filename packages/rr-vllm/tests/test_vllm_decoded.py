"""One result: every decoder called with a DecodeOptions returns DecodedRoutes (the samples, with
to_batch()), warns nothing, and gives the samples the deprecated form gives (which warns); the
deprecated names of the facts and decode_vllm_batch warn and keep their results."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rr_core import RouteValidationError, RRError
from rr_fakes.emulations.engines import (
    r3v1_payload,
    sglang_openai_response,
    sglang_openai_stream,
    sglang_response,
    trtllm_request_output,
    vllm_generate_stream,
    vllm_http_response,
)
from rr_vllm import (
    DecodedRoutes,
    DecodeOptions,
    EngineOutputError,
    SampleRoutes,
    decode_r3v1,
    decode_routes_array,
    decode_sglang,
    decode_sglang_openai,
    decode_sglang_stream,
    decode_trtllm_output,
    decode_trtllm_routes,
    decode_vllm_batch,
    decode_vllm_http,
    decode_vllm_output,
    decode_vllm_stream,
    validate_samples,
)
from vllm_testing import META, distinct_routes, streamed_output

P, G = 6, 5
OPTIONS = DecodeOptions(meta=META)
ROUTES = distinct_routes(META, P + G - 1, seed=7)


def _same(a: SampleRoutes | None, b: SampleRoutes | None) -> None:
    assert a is not None
    assert b is not None
    np.testing.assert_array_equal(a.routes_TLK, b.routes_TLK)
    np.testing.assert_array_equal(a.valid_T, b.valid_T)
    assert (a.num_prompt_tokens, a.prompt_start, a.finish_reason) == (
        b.num_prompt_tokens,
        b.prompt_start,
        b.finish_reason,
    )


def _sglang() -> dict[str, Any]:
    return sglang_response(
        prompt_ids=list(range(P)),
        generated_ids=list(range(100, 100 + G)),
        routes_TLK=ROUTES,
        num_experts=META.num_experts,
        sglang_version="0.5.23",
    )


def _trtllm() -> Any:
    return trtllm_request_output(
        list(range(100, 100 + P)), [(list(range(G)), ROUTES)], META.moe_slots
    )


_MOE_ROWS = ROUTES[:, list(META.moe_slots)]
_FACTS = {"num_prompt_tokens": P, "num_generated_tokens": G}

#: Each decoder: (decoder, its answer, the facts it is called with, is one sample).
CASES: dict[str, tuple[Callable[..., Any], Callable[[], Any], dict[str, int], bool]] = {
    "decode_vllm_output": (decode_vllm_output, lambda: streamed_output(P, G)[0], {}, False),
    "decode_vllm_http": (
        decode_vllm_http,
        lambda: vllm_http_response(streamed_output(P, G)[0]),
        {},
        False,
    ),
    "decode_vllm_stream": (
        decode_vllm_stream,
        lambda: vllm_generate_stream(streamed_output(P, G)[0]),
        {},
        False,
    ),
    "decode_sglang": (decode_sglang, _sglang, {}, True),
    "decode_sglang_openai": (
        decode_sglang_openai,
        lambda: sglang_openai_response([_sglang()]),
        {},
        False,
    ),
    "decode_sglang_stream": (
        decode_sglang_stream,
        lambda: sglang_openai_stream(_sglang()),
        {},
        True,
    ),
    "decode_trtllm_output": (decode_trtllm_output, _trtllm, {}, False),
    "decode_trtllm_routes": (decode_trtllm_routes, lambda: _MOE_ROWS, _FACTS, True),
    "decode_routes_array": (decode_routes_array, lambda: ROUTES, _FACTS, True),
    "decode_r3v1": (
        decode_r3v1,
        lambda: r3v1_payload(_MOE_ROWS, np.arange(P + G) < P + G - 1),
        _FACTS,
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_decoder_returns_decoded_routes_and_the_old_form_its_old_result(name: str) -> None:
    decoder, answer, facts, one = CASES[name]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*goes in the next release", DeprecationWarning)
        routes = decoder(answer(), OPTIONS, **facts)
    assert isinstance(routes, DecodedRoutes)
    assert routes.options is OPTIONS
    with pytest.warns(DeprecationWarning, match=rf"{name}\(answer, meta, \*\*options\) is deprec"):
        legacy = decoder(answer(), META, **facts)
    if one:
        assert isinstance(legacy, SampleRoutes)
        _same(routes.only(), legacy)
    else:
        assert isinstance(legacy, list)
        assert len(routes) == len(legacy)
        for a, b in zip(routes, legacy, strict=True):
            _same(a, b)
    kept = [s for s in routes if s is not None]
    batch = routes.to_batch()
    assert batch.equal(validate_samples(kept, META, allow_all_zero=True))


def test_the_old_aliases_and_fact_names_warn_and_decode_alike() -> None:
    out, _ = streamed_output(P, G, start=2)
    options = DecodeOptions(meta=META, prompt_start=2, engine_version="0.30.0")
    new = decode_vllm_output(out, options).only()
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        (old,) = decode_vllm_output(out, META, prompt_start=2)
    _same(new, old)
    http = vllm_http_response(out)
    ids = http["choices"][0].pop("prompt_token_ids")
    http.pop("prompt_token_ids", None)
    by_count = decode_vllm_http(http, options, num_prompt_tokens=len(ids)).only()
    with pytest.warns(DeprecationWarning, match=r"prompt_token_ids=\) is deprecated.*num_prompt"):
        by_ids = decode_vllm_http(http, options, prompt_token_ids=ids).only()
    _same(by_count, by_ids)
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, engine_version="):
        decode_sglang(_sglang(), META, sglang_version="0.5.23")
    body = sglang_openai_response([_sglang()])
    usage = body.pop("usage")

    def counted(names: tuple[str, str]) -> SampleRoutes | None:
        """The answer decoded with usage's counts passed under ``names`` (P's, G's)."""
        counts = (usage["prompt_tokens"], usage["completion_tokens"])
        return decode_sglang_openai(body, OPTIONS, **dict(zip(names, counts, strict=True))).only()

    by_new = counted(("num_prompt_tokens", "num_generated_tokens"))
    with (
        pytest.warns(DeprecationWarning, match=r"prompt_tokens=\) is deprecated"),
        pytest.warns(DeprecationWarning, match=r"completion_tokens=\) is deprecated"),
    ):
        by_old = counted(("prompt_tokens", "completion_tokens"))
    _same(by_new, by_old)


def test_decode_vllm_batch_warns_and_gives_the_one_copy_batch() -> None:
    outputs = [streamed_output(P, G, seed=i, start=i)[0] for i in range(3)]
    routes = decode_vllm_output(outputs, OPTIONS, prompt_starts=[0, 1, 2])
    assert len(routes) == 3
    batch = routes.to_batch()
    with pytest.warns(DeprecationWarning, match=r"decode_vllm_batch.*\.to_batch\(\)"):
        old = decode_vllm_batch(outputs, META, prompt_start=[0, 1, 2])
    assert batch.equal(old)
    assert batch.equal(validate_samples(list(routes), META))  # the samples, read after
    assert batch.equal(routes.to_batch())  # read samples batch alike
    with pytest.raises(EngineOutputError, match="prompt_starts has 2 values for 3 requests"):
        decode_vllm_output(outputs, OPTIONS, prompt_starts=[0, 1])


def test_rows_that_do_not_fit_raise_when_read_or_batched() -> None:
    out, _ = streamed_output(P, G, start=2)  # sent with 2, decoded with 0
    routes = decode_vllm_output(out, OPTIONS)  # the fields are read here
    with pytest.raises(RRError, match="N=8 route rows for T=11 tokens"):
        routes.to_batch()
    with pytest.raises(RRError, match="N=8 route rows for T=11 tokens"):
        routes.only()
    with pytest.raises(EngineOutputError, match="RequestOutput or a list"):
        decode_vllm_output("not an output", OPTIONS)


def test_decoded_routes_join_batch_and_refuse() -> None:
    a = decode_sglang(_sglang(), OPTIONS)
    b = decode_routes_array(ROUTES, OPTIONS, num_prompt_tokens=P, num_generated_tokens=G)
    both = a + b
    assert len(both) == 2
    assert both.to_batch().equal(validate_samples([a.only(), b.only()], META))
    with pytest.raises(
        EngineOutputError, match="only\\(\\) reads a one-sample answer; this one has 2"
    ):
        both.only()
    other = decode_sglang(_sglang(), DecodeOptions(meta=META, validate=False))
    with pytest.raises(EngineOutputError, match="of other options"):
        both + other
    with pytest.raises(EngineOutputError, match="takes the DecodeOptions"):
        DecodedRoutes([a.only()], META)  # type: ignore[arg-type]
    with pytest.raises(EngineOutputError, match="SampleRoutes"):
        DecodedRoutes(["junk"], OPTIONS)  # type: ignore[list-item]
    dropping = DecodeOptions(meta=META, on_abort="drop")
    dropped = decode_routes_array(
        ROUTES, dropping, num_prompt_tokens=P, num_generated_tokens=G, finish_reason="abort"
    )
    assert list(dropped) == [None]
    with pytest.raises(EngineOutputError, match="sample 0 is None"):
        dropped.to_batch()
    aborted, _ = streamed_output(P, G, finish_reason="abort")
    with pytest.raises(EngineOutputError, match="to_batch\\(\\) masks aborted requests"):
        decode_vllm_output([aborted], dropping).to_batch()


def test_the_options_refuse_a_meta_off_the_all_layers_axis() -> None:
    moe = type(META)(
        num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=META.moe_layer_numbers
    )
    with pytest.raises(RouteValidationError, match="all_layers axis"):
        DecodeOptions(meta=moe)


def test_the_streams_old_fact_names_and_the_engine_aliases_warn_and_decode_alike() -> None:
    chunks = list(vllm_generate_stream(streamed_output(P, G)[0]))
    new = decode_vllm_stream(chunks, OPTIONS, num_prompt_tokens=P).only()
    with pytest.warns(DeprecationWarning, match=r"prompt_token_ids=\) is deprecated.*num_prompt"):
        old = decode_vllm_stream(chunks, OPTIONS, prompt_token_ids=list(range(P))).only()
    _same(new, old)
    stream = list(sglang_openai_stream(_sglang()))
    facts = {"num_prompt_tokens": P, "num_generated_tokens": G}
    by_new = decode_sglang_stream(stream, OPTIONS, **facts).only()
    with (
        pytest.warns(DeprecationWarning, match=r"prompt_tokens=\) is deprecated"),
        pytest.warns(DeprecationWarning, match=r"completion_tokens=\) is deprecated"),
    ):
        by_old = decode_sglang_stream(stream, OPTIONS, prompt_tokens=P, completion_tokens=G)
    _same(by_new, by_old.only())
    at_two = DecodeOptions(meta=META, prompt_start=2, engine_version="0.5.23")
    answer = sglang_response(
        prompt_ids=list(range(P)),
        generated_ids=list(range(100, 100 + G)),
        routes_TLK=ROUTES,
        num_experts=META.num_experts,
        sglang_version="0.5.23",
        start_len=2,
    )
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        by_alias = decode_sglang(answer, META, start_len=2, sglang_version="0.5.23")
    _same(decode_sglang(answer, at_two).only(), by_alias)
    out, _ = streamed_output(P, G, start=2)
    vllm_at_two = DecodeOptions(meta=META, prompt_start=2, engine_version="0.33.0")
    with pytest.warns(DeprecationWarning, match=r"DecodeOptions\(meta=meta, prompt_start="):
        by_vllm_alias = decode_vllm_http(
            vllm_http_response(out), META, prompt_start=2, vllm_version="0.33.0"
        )
    _same(decode_vllm_http(vllm_http_response(out), vllm_at_two).only(), by_vllm_alias[0])
