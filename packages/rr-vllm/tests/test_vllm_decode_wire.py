"""Decoding the wire forms: vLLM's HTTP answers (base64 ``.npy`` rows) and SGLang's (base64
int32 rows), and the batch checks of decoded samples, against rr_fakes' engine emulations.

Shapes: T tokens, N engine rows, L layer slots (all_layers axis), K top-k, E experts.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from decode_testing import FLAT_ERAS, G, K, L, P, assert_placed, build, make_routes, one
from rr_core import AlignmentError, RouteBatch, RouteMeta, RouteValidationError
from rr_fakes.emulations.engines import (
    CompletionOutput,
    Faults,
    VllmEra,
    sglang_response,
    vllm_http_response,
)
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_routes_array,
    decode_sglang,
    decode_vllm_http,
    decode_vllm_output,
    npy_base64_to_array,
    sglang_base64_to_array,
    validate_samples,
)
from vllm_testing import make_meta

# --- HTTP -------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", FLAT_ERAS)
@pytest.mark.parametrize("read_only", [False, True])
def test_http_round_trip(era: VllmEra, read_only: bool) -> None:
    meta = make_meta(num_experts=384, dense=(2,))
    routes = make_routes(meta)
    body = vllm_http_response(build(era, meta, routes, faults=Faults(read_only=read_only)))
    s = one(decode_vllm_http(body, DecodeOptions(meta=meta)))
    assert_placed(s, routes)
    validate_samples([s], meta)


def test_http_prompt_start_and_abort() -> None:
    meta = make_meta()
    routes = make_routes(meta)
    body = vllm_http_response(build(VllmEra.V0_32, meta, routes, prompt_start=3))
    assert_placed(one(decode_vllm_http(body, DecodeOptions(meta=meta, prompt_start=3))), routes, 3)
    aborted = vllm_http_response(
        build(VllmEra.V0_22, meta, routes, faults=Faults(missing=True, abort_after_rows=0))
    )
    assert list(decode_vllm_http(aborted, DecodeOptions(meta=meta, on_abort="drop"))) == [None]
    missing = vllm_http_response(build(VllmEra.V0_22, meta, routes, faults=Faults(missing=True)))
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_http(missing, DecodeOptions(meta=meta))


def test_http_needs_token_ids() -> None:
    meta = make_meta()
    body = vllm_http_response(build(VllmEra.V0_22, meta, make_routes(meta)))
    del body["choices"][0]["token_ids"]
    with pytest.raises(EngineOutputError, match="return_token_ids"):
        decode_vllm_http(body, DecodeOptions(meta=meta))


def _npy(array: np.ndarray, *, allow_pickle: bool = False) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.parametrize(
    "text",
    [
        _npy(np.zeros((3, L, K), np.int32))[:-12],  # truncated
        "not base64 at all!",
        _npy(np.zeros((3, L, K), np.int32)).replace("A", "*", 1),
        base64.b64encode(b"plain bytes, no npy header").decode(),
        _npy(np.array([{"a": 1}], dtype=object), allow_pickle=True),  # a pickle is refused
        "",
    ],
)
def test_corrupt_base64_strings(text: str) -> None:
    with pytest.raises(EngineOutputError):
        npy_base64_to_array(text)


def test_npy_of_wrong_rank_or_type() -> None:
    with pytest.raises(EngineOutputError, match="integer"):
        npy_base64_to_array(_npy(np.zeros((3, K), np.int32)))
    with pytest.raises(EngineOutputError, match="integer"):
        npy_base64_to_array(_npy(np.zeros((3, L, K), np.float32)))
    with pytest.raises(EngineOutputError, match="base64 string"):
        npy_base64_to_array(123)  # type: ignore[arg-type]


def test_npy_big_endian_and_fortran() -> None:
    routes = make_routes(make_meta()).astype(">i4")
    np.testing.assert_array_equal(npy_base64_to_array(_npy(routes)), routes)
    fortran = np.asfortranarray(routes.astype(np.int32))
    np.testing.assert_array_equal(npy_base64_to_array(_npy(fortran)), routes)


# --- SGLang -----------------------------------------------------------------------------------


def sglang(meta: RouteMeta, routes: np.ndarray, **kw: object) -> dict[str, object]:
    return sglang_response(
        prompt_ids=list(range(P)),
        generated_ids=list(range(G)),
        routes_TLK=routes,
        num_experts=meta.num_experts,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("start_len", [0, 2, P])
def test_sglang_round_trip(start_len: int) -> None:
    meta = make_meta(dense=(1,))
    routes = make_routes(meta)
    response = sglang(meta, routes, start_len=start_len)
    s = decode_sglang(response, DecodeOptions(meta=meta, prompt_start=start_len)).only()
    assert s is not None
    assert_placed(s, routes, start_len)
    assert s.routes_TLK.flags.writeable
    same = decode_sglang(
        response["meta_info"], DecodeOptions(meta=meta, prompt_start=start_len)
    ).only()  # type: ignore[arg-type]
    assert same is not None
    assert np.array_equal(same.routes_TLK, s.routes_TLK)
    validate_samples([s], meta)


def test_sglang_faults() -> None:
    meta = make_meta(dense=(1,))
    routes = make_routes(meta)
    with pytest.raises(EngineOutputError, match="D3"):
        decode_sglang(
            sglang(meta, routes, faults=Faults(missing=True)), DecodeOptions(meta=meta)
        ).only()
    aborted = decode_sglang(
        sglang(meta, routes, faults=Faults(abort_after_rows=2)), DecodeOptions(meta=meta)
    ).only()
    assert aborted is not None
    assert not aborted.valid_T.any()
    assert (
        decode_sglang(
            sglang(meta, routes, faults=Faults(abort_after_rows=2)),
            DecodeOptions(meta=meta, on_abort="drop"),
        ).only()
        is None
    )
    zero = decode_sglang(
        sglang(meta, routes, faults=Faults(all_zero=True)), DecodeOptions(meta=meta)
    ).only()
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([zero], meta)  # type: ignore[list-item]
    draft = decode_sglang(
        sglang(meta, routes, faults=Faults(draft_layer0=1)), DecodeOptions(meta=meta)
    ).only()
    with pytest.raises(RouteValidationError, match="dense"):
        validate_samples([draft], meta)  # type: ignore[list-item]


def test_sglang_lengths_not_divisible() -> None:
    meta = make_meta()
    response = sglang(meta, make_routes(meta))
    info = response["meta_info"]
    raw = base64.b64decode(info["routed_experts"])  # type: ignore[index]
    for cut in (4, 3):
        info["routed_experts"] = base64.b64encode(raw[:-cut]).decode()  # type: ignore[index]
        with pytest.raises(EngineOutputError, match="not a multiple"):
            decode_sglang(response, DecodeOptions(meta=meta)).only()
    with pytest.raises(EngineOutputError, match="not a multiple"):
        sglang_base64_to_array(base64.b64encode(raw).decode(), L + 1, K)
    with pytest.raises(EngineOutputError, match="base64"):
        sglang_base64_to_array("@@@", L, K)


def test_sglang_wrong_row_count() -> None:
    meta = make_meta()
    response = sglang(meta, make_routes(meta))
    response["meta_info"]["completion_tokens"] = G + 2  # type: ignore[index]
    with pytest.raises(AlignmentError):
        decode_sglang(response, DecodeOptions(meta=meta)).only()


# --- validation entry ---------------------------------------------------------------------------


def test_validate_refuses_the_moe_axis() -> None:
    meta = make_meta()
    s = decode_routes_array(
        make_routes(meta), DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
    ).only()
    moe = RouteMeta(num_experts=8, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2, 3, 4))
    with pytest.raises(RouteValidationError, match="all_layers"):
        validate_samples([s], moe)  # type: ignore[list-item]


def test_repeated_ids_name_the_sample() -> None:
    meta = make_meta()
    good = make_routes(meta)
    bad = good.copy()
    bad[1, 2] = [3, 3]
    samples = [
        decode_routes_array(
            r, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
        ).only()
        for r in (good, bad)
    ]
    with pytest.raises(RouteValidationError, match=r"sequence 1, token row 1.*repeat"):
        validate_samples(samples, meta)  # type: ignore[arg-type]
    assert isinstance(validate_samples(samples[:1], meta), RouteBatch)  # type: ignore[arg-type]


def test_completion_output_duck_type_is_enough() -> None:
    meta = make_meta()
    routes = make_routes(meta).astype(np.int32)
    completion = CompletionOutput(
        index=0,
        text="",
        token_ids=list(range(G)),
        cumulative_logprob=None,
        logprobs=None,
        routed_experts=routes,
        finish_reason="stop",
    )

    class Request:
        def __init__(self) -> None:
            self.request_id = "r"
            self.prompt_token_ids = list(range(P))
            self.outputs = [completion]

    assert_placed(one(decode_vllm_output(Request(), DecodeOptions(meta=meta))), routes)
