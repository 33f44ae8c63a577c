"""Near-miss sweeps over rr_vllm's data-facing entry points: the plausible wrong data
users produce, not junk. Each call gives the right result or an RRError naming the argument:
streams in the byte chunks an HTTP client yields, JSON text where a body or a configuration
goes, other spellings of roles and policies, route ids in another dtype, per-request starts one
past the request count."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rr_fakes.emulations.engines import (
    sglang_server_info,
    vllm_generate_stream,
    vllm_http_response,
    vllm_request_output,
)
from rr_fakes.sweeps import (
    SWEEP,
    byte_chunks,
    json_text,
    just_past,
    right_or_named,
    spellings,
    widened,
)
from rr_vllm import (
    DecodeOptions,
    decode_routes_array,
    decode_vllm_http,
    decode_vllm_output,
    decode_vllm_stream,
    sglang_engine_config,
    vllm_engine_config,
)
from vllm_testing import META, distinct_routes, streamed_output

P, G = 6, 4
ROUTES = distinct_routes(META, P + G - 1, seed=11)
OUT = vllm_request_output(
    "0.32+", prompt_ids=range(P), generated_ids=range(G), routes_TLK=ROUTES, num_experts=8
)
(EXPECTED,) = decode_vllm_output(OUT, DecodeOptions(meta=META))
STREAM_OUT, _ = streamed_output(start=2)
STREAM = "".join(vllm_generate_stream(STREAM_OUT, include_usage=True)).encode()
(STREAMED,) = decode_vllm_stream([STREAM], DecodeOptions(meta=META, prompt_start=2))


def same(sample: Any, expected: Any = EXPECTED) -> bool:
    return bool(
        np.array_equal(sample.routes_TLK, expected.routes_TLK)
        and np.array_equal(sample.valid_T, expected.valid_T)
    )


@SWEEP
@given(chunks=byte_chunks(STREAM))
def test_a_stream_in_byte_chunks_decodes_as_the_whole(chunks: list[bytes]) -> None:
    # an intact body: the right result only, a refusal is wrong here
    (sample,) = decode_vllm_stream(chunks, DecodeOptions(meta=META, prompt_start=2))
    assert same(sample, STREAMED)


@SWEEP
@given(text=json_text(vllm_http_response(OUT)))
def test_an_http_answer_as_json_text_is_read_or_named(text: Any) -> None:
    right_or_named(
        lambda: decode_vllm_http(text, DecodeOptions(meta=META)),
        "response",
        "mapping",
        right=lambda o: same(o[0]),
    )


@SWEEP
@given(data=st.data())
def test_route_ids_in_another_dtype_decode_alike_or_are_named(data: st.DataObject) -> None:
    routes = data.draw(widened(ROUTES))
    right_or_named(
        lambda: decode_routes_array(
            routes, DecodeOptions(meta=META), num_prompt_tokens=P, num_generated_tokens=G
        ).only(),
        "routes",
        "dtype",
        right=lambda s: np.array_equal(s.routes_TLK.astype(np.int64), EXPECTED.routes_TLK),
    )


SETTINGS = {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "dtype": "bfloat16"}


@SWEEP
@given(text=json_text(sglang_server_info("0.5.23", **SETTINGS)))
def test_a_server_info_body_as_json_text_reads_as_the_body(text: Any) -> None:
    expected = sglang_engine_config(sglang_server_info("0.5.23", **SETTINGS))
    right_or_named(lambda: sglang_engine_config(text), "source", right=lambda c: c == expected)


@SWEEP
@given(
    role=st.sampled_from(["kv_producer", "kv_consumer", "kv_both"]).flatmap(spellings),
    as_text=st.booleans(),
)
def test_a_kv_role_in_another_spelling_is_its_side_or_named(role: str, as_text: bool) -> None:
    kv: Any = {"kv_connector": "NixlConnector", "kv_role": role}
    source = {"kv_transfer_config": json.dumps(kv) if as_text else kv}
    side = {"producer": "prefill", "consumer": "decode", "both": "both"}
    word = role.strip().lower().replace("-", "_").removeprefix("kv_")
    right_or_named(
        lambda: vllm_engine_config(source, vllm_version="0.33.0"),
        "kv_role",
        right=lambda c: c.disaggregation == side[word],
    )


@SWEEP
@given(policy=st.sampled_from(["mask", "drop"]).flatmap(spellings))
def test_an_abort_policy_in_another_spelling_is_the_policy_or_named(policy: str) -> None:
    right_or_named(
        lambda: DecodeOptions(meta=META, on_abort=policy),  # type: ignore[arg-type]
        "on_abort",
        right=lambda o: o.on_abort in ("mask", "drop"),
    )


@SWEEP
@given(count=just_past(2))
def test_per_request_starts_past_the_request_count_are_named(count: int) -> None:
    starts = [0] * count
    right_or_named(
        lambda: decode_vllm_output(
            [OUT, OUT], DecodeOptions(meta=META), prompt_starts=starts
        ).to_batch(),
        "prompt_start",
    )
