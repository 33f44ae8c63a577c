"""Decoding and validating every routed-experts format, against rr_fakes' engine emulations.

Shapes: T tokens, N engine rows, L layer slots (all_layers axis), K top-k, E experts.
"""

from __future__ import annotations

import base64
import dataclasses
import io
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import AlignmentError, RouteBatch, RouteMeta, RouteValidationError
from rr_fakes.emulations.engines import (
    CompletionOutput,
    Faults,
    VllmEra,
    sglang_response,
    vllm_http_response,
)
from rr_vllm import (
    EngineOutputError,
    SampleRoutes,
    decode_routes_array,
    decode_sglang,
    decode_vllm_http,
    decode_vllm_output,
    npy_base64_to_array,
    sglang_base64_to_array,
    validate_samples,
)
from vllm_testing import distinct_routes, fake_vllm_output, make_meta

P, G, L, K = 5, 4, 4, 2
ALL_ERAS = list(VllmEra)
FLAT_ERAS = [VllmEra.V0_14, VllmEra.V0_22, VllmEra.V0_32]


def make_routes(meta: RouteMeta, rows: int = P + G - 1, seed: int = 0) -> np.ndarray:
    return distinct_routes(meta, rows, seed)


def build(era: VllmEra, meta: RouteMeta, routes: np.ndarray, **kw: Any) -> Any:
    return fake_vllm_output(era, meta, routes, P, G, **kw)


def one(samples: list[SampleRoutes | None]) -> SampleRoutes:
    assert len(samples) == 1
    s = samples[0]
    assert s is not None
    return s


def assert_placed(s: SampleRoutes, routes: np.ndarray, prompt_start: int = 0) -> None:
    assert s.routes_TLK.shape == (P + G, *routes.shape[1:])
    np.testing.assert_array_equal(s.routes_TLK[prompt_start : P + G - 1], routes[prompt_start:])
    assert not s.routes_TLK[:prompt_start].any()
    assert not s.routes_TLK[-1].any()
    expected = np.zeros(P + G, dtype=bool)
    expected[prompt_start : P + G - 1] = True
    np.testing.assert_array_equal(s.valid_T, expected)


# --- every era ---------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
@pytest.mark.parametrize("dense", [(), (1,), (1, 3)])
def test_every_era_round_trips(era: VllmEra, dense: tuple[int, ...]) -> None:
    meta = make_meta(dense=dense)
    routes = make_routes(meta)
    s = one(decode_vllm_output(build(era, meta, routes), meta))
    assert_placed(s, routes)
    batch = validate_samples([s], meta)
    values, valid = batch.sequence(0)
    assert torch.equal(values[:-1].to(torch.int64), torch.from_numpy(routes))
    assert valid.tolist() == s.valid_T.tolist()


@pytest.mark.parametrize("era", [VllmEra.V0_22, VllmEra.V0_32])
@pytest.mark.parametrize("prompt_start", [0, 2, P])
def test_prompt_start(era: VllmEra, prompt_start: int) -> None:
    meta = make_meta(dense=(2,))
    routes = make_routes(meta)
    out = build(era, meta, routes, prompt_start=prompt_start)
    s = one(decode_vllm_output(out, meta, prompt_start=prompt_start))
    assert_placed(s, routes, prompt_start)
    validate_samples([s], meta)


def test_prompt_start_mismatch_is_an_alignment_error() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_22, meta, make_routes(meta), prompt_start=2)
    with pytest.raises(AlignmentError, match="prompt_start=0"):
        decode_vllm_output(out, meta)


def test_row_count_t_is_accepted_and_others_refused() -> None:
    meta = make_meta()
    routes = make_routes(meta, rows=P + G)
    s = decode_routes_array(routes, meta, num_prompt_tokens=P, num_generated_tokens=G)
    assert s is not None
    assert s.valid_T.all()
    for rows in (P + G - 2, P + G + 1):
        with pytest.raises(AlignmentError, match="route rows"):
            decode_routes_array(
                make_routes(meta, rows=rows), meta, num_prompt_tokens=P, num_generated_tokens=G
            )


def test_wrong_layer_count_names_the_shape() -> None:
    meta = make_meta()
    other = make_meta(layers=L + 1)
    out = build(VllmEra.V0_14, other, make_routes(other))
    with pytest.raises(EngineOutputError, match=r"expected \[rows, 4, 2\]"):
        decode_vllm_output(out, meta)


def test_n_greater_than_one_decodes_each_completion() -> None:
    meta = make_meta()
    a, b = make_routes(meta, seed=1), make_routes(meta, seed=2)
    out = build(VllmEra.V0_22, meta, a)
    second = build(VllmEra.V0_22, meta, b).outputs[0]
    out.outputs.append(dataclasses.replace(second, index=1))
    first, other = decode_vllm_output(out, meta)
    assert first is not None
    assert other is not None
    assert_placed(first, a)
    assert_placed(other, b)
    batch = validate_samples([first, other], meta)
    assert batch.num_sequences == 2


# --- 0.21 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cached", [0, 2, P])
def test_v021_re_expands_and_invalidates_cached_rows(cached: int) -> None:
    meta = make_meta(dense=(1, 3))
    routes = make_routes(meta)
    s = one(decode_vllm_output(build(VllmEra.V0_21, meta, routes, cached_prefix=cached), meta))
    assert s.routes_TLK.dtype == np.int16
    expected = np.ones(P + G, dtype=bool)
    expected[:cached] = False
    expected[-1] = False
    np.testing.assert_array_equal(s.valid_T, expected)
    np.testing.assert_array_equal(s.routes_TLK[cached:-1], routes[cached:])
    assert not s.routes_TLK[:cached].any()
    validate_samples([s], meta)


def test_v021_preempted_is_a_clear_error() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_21, meta, make_routes(meta), preempted=True)
    with pytest.raises(EngineOutputError, match="preempted"):
        decode_vllm_output(out, meta)


def test_v021_has_no_prompt_start() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_21, meta, make_routes(meta))
    with pytest.raises(EngineOutputError, match=r"0\.22"):
        decode_vllm_output(out, meta, prompt_start=1)


def test_v021_partial_minus_one_is_refused() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_21, meta, make_routes(meta))
    gen = out.outputs[0].routed_experts.copy()
    gen[0, 0, 0] = -1
    out.outputs[0].routed_experts = gen
    s = one(decode_vllm_output(out, meta))
    assert s.valid_T[P]  # only whole -1 rows are prefix-cached
    with pytest.raises(RouteValidationError, match="min -1"):
        validate_samples([s], meta)


# --- dtypes and memory -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_experts", "dtype", "batch_dtype"),
    [(256, np.uint8, torch.uint8), (257, np.uint16, torch.int16), (384, np.uint16, torch.int16)],
)
def test_compact_dtypes(num_experts: int, dtype: type, batch_dtype: torch.dtype) -> None:
    meta = make_meta(num_experts=num_experts)
    routes = make_routes(meta)
    routes[0, 1] = [num_experts - 1, 0]  # the largest id survives exactly
    s = one(decode_vllm_output(build(VllmEra.V0_22, meta, routes), meta))
    assert s.routes_TLK.dtype == dtype
    batch = validate_samples([s], meta)
    assert batch.values_NLK.dtype == batch_dtype
    assert int(batch.values_NLK[0, 1, 0]) == num_experts - 1


@pytest.mark.parametrize("era", ALL_ERAS)
def test_read_only_input_is_copied_once(era: VllmEra) -> None:
    meta = make_meta()
    routes = make_routes(meta)
    out = build(era, meta, routes, faults=Faults(read_only=True))
    engine = out.outputs[0].routed_experts
    assert not engine.flags.writeable
    s = one(decode_vllm_output(out, meta))
    assert s.routes_TLK.flags.writeable
    assert not np.shares_memory(s.routes_TLK, engine)
    assert_placed(s, routes)
    validate_samples([s], meta)


def test_non_contiguous_and_torch_inputs() -> None:
    meta = make_meta()
    routes = make_routes(meta)
    wide = np.zeros((routes.shape[0], L, 2 * K), dtype=np.int32)
    wide[..., ::2] = routes
    strided = wide[..., ::2]
    assert not strided.flags.c_contiguous
    for value in (strided, np.asfortranarray(routes), torch.from_numpy(routes), routes[::-1][::-1]):
        s = decode_routes_array(value, meta, num_prompt_tokens=P, num_generated_tokens=G)
        assert s is not None
        assert_placed(s, routes)


def test_non_integer_routes_are_refused() -> None:
    meta = make_meta()
    with pytest.raises(EngineOutputError, match="integer"):
        decode_routes_array(
            make_routes(meta).astype(float), meta, num_prompt_tokens=P, num_generated_tokens=G
        )


# --- fault knobs -------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
def test_all_zero_is_e1(era: VllmEra) -> None:
    meta = make_meta()
    s = one(
        decode_vllm_output(build(era, meta, make_routes(meta), faults=Faults(all_zero=True)), meta)
    )
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([s], meta)


def test_all_zero_allowed_with_top_1() -> None:
    meta = dataclasses.replace(make_meta(), top_k=1)
    routes = np.zeros((P + G - 1, L, 1), dtype=np.int32)
    s = decode_routes_array(routes, meta, num_prompt_tokens=P, num_generated_tokens=G)
    assert s is not None
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([s], meta)
    validate_samples([s], meta, allow_all_zero=True)


@pytest.mark.parametrize("era", FLAT_ERAS)
def test_physical_ids_above_e_are_e2(era: VllmEra) -> None:
    meta = make_meta(num_experts=8)
    table = np.arange(8) + 8
    out = build(era, meta, make_routes(meta), faults=Faults(physical_map=table))
    s = one(decode_vllm_output(out, meta))
    with pytest.raises(RouteValidationError, match="E2"):
        validate_samples([s], meta)


def test_physical_ids_in_a_logical_range_are_e2_unless_allowed() -> None:
    meta = make_meta(num_experts=16)  # 16 physical slots, 8 logical experts
    routes = make_routes(make_meta(num_experts=8))
    out = build(VllmEra.V0_14, meta, routes, faults=Faults(physical_map=np.arange(8) + 8))
    s = one(decode_vllm_output(out, meta))
    with pytest.raises(RouteValidationError, match="E2"):
        validate_samples([s], meta, logical_experts=8)
    validate_samples([s], meta, logical_experts=8, allow_physical=True)
    honest = one(decode_vllm_output(build(VllmEra.V0_14, meta, routes), meta))
    validate_samples([honest], meta, logical_experts=8)


def test_uint8_overflow_is_e4() -> None:
    meta = make_meta(num_experts=300)
    out = build(VllmEra.V0_22, meta, make_routes(meta), faults=Faults(uint8_overflow=True))
    s = one(decode_vllm_output(out, meta))
    assert s.routes_TLK.dtype == np.uint8
    with pytest.raises(RouteValidationError, match="E4"):
        validate_samples([s], meta)


@pytest.mark.parametrize("era", FLAT_ERAS)
def test_draft_layer0_over_a_dense_layer_is_caught(era: VllmEra) -> None:
    meta = make_meta(dense=(1,))
    out = build(era, meta, make_routes(meta), faults=Faults(draft_layer0=3))
    s = one(decode_vllm_output(out, meta))
    with pytest.raises(RouteValidationError, match="dense"):
        validate_samples([s], meta)


@pytest.mark.parametrize("era", ALL_ERAS)
@pytest.mark.parametrize("rows", [0, 3])
def test_aborted_requests_are_masked_or_dropped(era: VllmEra, rows: int) -> None:
    meta = make_meta()
    out = build(era, meta, make_routes(meta), faults=Faults(abort_after_rows=rows))
    s = one(decode_vllm_output(out, meta))
    assert s.aborted
    assert s.routes_TLK.shape == (P + G, L, K)
    assert not s.valid_T.any()
    assert decode_vllm_output(out, meta, on_abort="drop") == [None]
    batch = validate_samples([s], meta)
    assert not batch.valid_N.any()


@pytest.mark.parametrize("era", ALL_ERAS)
def test_missing_routes_of_a_finished_request_are_d3(era: VllmEra) -> None:
    meta = make_meta()
    out = build(era, meta, make_routes(meta), faults=Faults(missing=True))
    with pytest.raises(EngineOutputError, match=r"D3|preempted"):
        decode_vllm_output(out, meta)
    aborted = build(era, meta, make_routes(meta), faults=Faults(missing=True, abort_after_rows=0))
    assert not one(decode_vllm_output(aborted, meta)).valid_T.any()


def test_abort_policy_is_checked() -> None:
    meta = make_meta()
    with pytest.raises(ValueError, match="on_abort"):
        decode_vllm_output(build(VllmEra.V0_14, meta, make_routes(meta)), meta, on_abort="skip")  # type: ignore[arg-type]


# --- HTTP -------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", FLAT_ERAS)
@pytest.mark.parametrize("read_only", [False, True])
def test_http_round_trip(era: VllmEra, read_only: bool) -> None:
    meta = make_meta(num_experts=384, dense=(2,))
    routes = make_routes(meta)
    body = vllm_http_response(build(era, meta, routes, faults=Faults(read_only=read_only)))
    s = one(decode_vllm_http(body, meta))
    assert_placed(s, routes)
    validate_samples([s], meta)


def test_http_prompt_start_and_abort() -> None:
    meta = make_meta()
    routes = make_routes(meta)
    body = vllm_http_response(build(VllmEra.V0_32, meta, routes, prompt_start=3))
    assert_placed(one(decode_vllm_http(body, meta, prompt_start=3)), routes, 3)
    aborted = vllm_http_response(
        build(VllmEra.V0_22, meta, routes, faults=Faults(missing=True, abort_after_rows=0))
    )
    assert decode_vllm_http(aborted, meta, on_abort="drop") == [None]
    missing = vllm_http_response(build(VllmEra.V0_22, meta, routes, faults=Faults(missing=True)))
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_http(missing, meta)


def test_http_needs_token_ids() -> None:
    meta = make_meta()
    body = vllm_http_response(build(VllmEra.V0_22, meta, make_routes(meta)))
    del body["choices"][0]["token_ids"]
    with pytest.raises(EngineOutputError, match="return_token_ids"):
        decode_vllm_http(body, meta)


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
    s = decode_sglang(response, meta, start_len=start_len)
    assert s is not None
    assert_placed(s, routes, start_len)
    assert s.routes_TLK.flags.writeable
    same = decode_sglang(response["meta_info"], meta, start_len=start_len)  # type: ignore[arg-type]
    assert same is not None
    assert np.array_equal(same.routes_TLK, s.routes_TLK)
    validate_samples([s], meta)


def test_sglang_faults() -> None:
    meta = make_meta(dense=(1,))
    routes = make_routes(meta)
    with pytest.raises(EngineOutputError, match="D3"):
        decode_sglang(sglang(meta, routes, faults=Faults(missing=True)), meta)
    aborted = decode_sglang(sglang(meta, routes, faults=Faults(abort_after_rows=2)), meta)
    assert aborted is not None
    assert not aborted.valid_T.any()
    assert (
        decode_sglang(
            sglang(meta, routes, faults=Faults(abort_after_rows=2)), meta, on_abort="drop"
        )
        is None
    )
    zero = decode_sglang(sglang(meta, routes, faults=Faults(all_zero=True)), meta)
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([zero], meta)  # type: ignore[list-item]
    draft = decode_sglang(sglang(meta, routes, faults=Faults(draft_layer0=1)), meta)
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
            decode_sglang(response, meta)
    with pytest.raises(EngineOutputError, match="not a multiple"):
        sglang_base64_to_array(base64.b64encode(raw).decode(), L + 1, K)
    with pytest.raises(EngineOutputError, match="base64"):
        sglang_base64_to_array("@@@", L, K)


def test_sglang_wrong_row_count() -> None:
    meta = make_meta()
    response = sglang(meta, make_routes(meta))
    response["meta_info"]["completion_tokens"] = G + 2  # type: ignore[index]
    with pytest.raises(AlignmentError):
        decode_sglang(response, meta)


# --- validation entry ---------------------------------------------------------------------------


def test_validate_refuses_the_moe_axis() -> None:
    meta = make_meta()
    s = decode_routes_array(make_routes(meta), meta, num_prompt_tokens=P, num_generated_tokens=G)
    moe = RouteMeta(num_experts=8, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2, 3, 4))
    with pytest.raises(RouteValidationError, match="all_layers"):
        validate_samples([s], moe)  # type: ignore[list-item]


def test_repeated_ids_name_the_sample() -> None:
    meta = make_meta()
    good = make_routes(meta)
    bad = good.copy()
    bad[1, 2] = [3, 3]
    samples = [
        decode_routes_array(r, meta, num_prompt_tokens=P, num_generated_tokens=G)
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

    assert_placed(one(decode_vllm_output(Request(), meta)), routes)
