"""Decoding vLLM's engine objects of every era, against rr_fakes' engine emulations (the wire
forms, HTTP and SGLang, are test_vllm_decode_wire's).

Shapes: T tokens, N engine rows, L layer slots (all_layers axis), K top-k, E experts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from decode_testing import ALL_ERAS, FLAT_ERAS, G, K, L, P, assert_placed, build, make_routes, one
from rr_core import AlignmentError, RouteValidationError
from rr_fakes.emulations.engines import (
    Faults,
    VllmEra,
)
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_routes_array,
    decode_vllm_output,
    validate_samples,
)
from vllm_testing import make_meta

# --- every era ---------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
@pytest.mark.parametrize("dense", [(), (1,), (1, 3)])
def test_every_era_round_trips(era: VllmEra, dense: tuple[int, ...]) -> None:
    meta = make_meta(dense=dense)
    routes = make_routes(meta)
    s = one(decode_vllm_output(build(era, meta, routes), DecodeOptions(meta=meta)))
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
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta, prompt_start=prompt_start)))
    assert_placed(s, routes, prompt_start)
    validate_samples([s], meta)


def test_prompt_start_mismatch_is_an_alignment_error() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_22, meta, make_routes(meta), prompt_start=2)
    with pytest.raises(AlignmentError, match="prompt_start=0"):
        list(decode_vllm_output(out, DecodeOptions(meta=meta)))


def test_row_count_t_is_accepted_and_others_refused() -> None:
    meta = make_meta()
    routes = make_routes(meta, rows=P + G)
    s = decode_routes_array(
        routes, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
    ).only()
    assert s is not None
    assert s.valid_T.all()
    for rows in (P + G - 2, P + G + 1):
        with pytest.raises(AlignmentError, match="route rows"):
            decode_routes_array(
                make_routes(meta, rows=rows),
                DecodeOptions(meta=meta),
                num_prompt_tokens=P,
                num_generated_tokens=G,
            ).only()


def test_wrong_layer_count_names_the_shape() -> None:
    meta = make_meta()
    other = make_meta(layers=L + 1)
    out = build(VllmEra.V0_14, other, make_routes(other))
    with pytest.raises(EngineOutputError, match=r"expected \[rows, 4, 2\]"):
        list(decode_vllm_output(out, DecodeOptions(meta=meta)))


def test_n_greater_than_one_decodes_each_completion() -> None:
    meta = make_meta()
    a, b = make_routes(meta, seed=1), make_routes(meta, seed=2)
    out = build(VllmEra.V0_22, meta, a)
    second = build(VllmEra.V0_22, meta, b).outputs[0]
    out.outputs.append(dataclasses.replace(second, index=1))
    first, other = decode_vllm_output(out, DecodeOptions(meta=meta))
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
    s = one(
        decode_vllm_output(
            build(VllmEra.V0_21, meta, routes, cached_prefix=cached), DecodeOptions(meta=meta)
        )
    )
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
        list(decode_vllm_output(out, DecodeOptions(meta=meta)))


def test_v021_has_no_prompt_start() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_21, meta, make_routes(meta))
    with pytest.raises(EngineOutputError, match=r"0\.22"):
        list(decode_vllm_output(out, DecodeOptions(meta=meta, prompt_start=1)))


def test_v021_partial_minus_one_is_refused() -> None:
    meta = make_meta()
    out = build(VllmEra.V0_21, meta, make_routes(meta))
    gen = out.outputs[0].routed_experts.copy()
    gen[0, 0, 0] = -1
    out.outputs[0].routed_experts = gen
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
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
    s = one(decode_vllm_output(build(VllmEra.V0_22, meta, routes), DecodeOptions(meta=meta)))
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
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
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
        s = decode_routes_array(
            value, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
        ).only()
        assert s is not None
        assert_placed(s, routes)


def test_non_integer_routes_are_refused() -> None:
    meta = make_meta()
    with pytest.raises(EngineOutputError, match="integer"):
        decode_routes_array(
            make_routes(meta).astype(float),
            DecodeOptions(meta=meta),
            num_prompt_tokens=P,
            num_generated_tokens=G,
        ).only()


# --- fault knobs -------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
def test_all_zero_is_e1(era: VllmEra) -> None:
    meta = make_meta()
    s = one(
        decode_vllm_output(
            build(era, meta, make_routes(meta), faults=Faults(all_zero=True)),
            DecodeOptions(meta=meta),
        )
    )
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([s], meta)


def test_all_zero_allowed_with_top_1() -> None:
    meta = dataclasses.replace(make_meta(), top_k=1)
    routes = np.zeros((P + G - 1, L, 1), dtype=np.int32)
    s = decode_routes_array(
        routes, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
    ).only()
    assert s is not None
    with pytest.raises(RouteValidationError, match="E1"):
        validate_samples([s], meta)
    validate_samples([s], meta, allow_all_zero=True)


@pytest.mark.parametrize("era", FLAT_ERAS)
def test_physical_ids_above_e_are_e2(era: VllmEra) -> None:
    meta = make_meta(num_experts=8)
    table = np.arange(8) + 8
    out = build(era, meta, make_routes(meta), faults=Faults(physical_map=table))
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
    with pytest.raises(RouteValidationError, match="E2"):
        validate_samples([s], meta)


def test_physical_ids_in_a_logical_range_are_e2_unless_allowed() -> None:
    meta = make_meta(num_experts=16)  # 16 physical slots, 8 logical experts
    routes = make_routes(make_meta(num_experts=8))
    out = build(VllmEra.V0_14, meta, routes, faults=Faults(physical_map=np.arange(8) + 8))
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
    with pytest.raises(RouteValidationError, match="E2"):
        validate_samples([s], meta, logical_experts=8)
    validate_samples([s], meta, logical_experts=8, allow_physical=True)
    honest = one(decode_vllm_output(build(VllmEra.V0_14, meta, routes), DecodeOptions(meta=meta)))
    validate_samples([honest], meta, logical_experts=8)


def test_uint8_overflow_is_e4() -> None:
    meta = make_meta(num_experts=300)
    out = build(VllmEra.V0_22, meta, make_routes(meta), faults=Faults(uint8_overflow=True))
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
    assert s.routes_TLK.dtype == np.uint8
    with pytest.raises(RouteValidationError, match="E4"):
        validate_samples([s], meta)


@pytest.mark.parametrize("era", FLAT_ERAS)
def test_draft_layer0_over_a_dense_layer_is_caught(era: VllmEra) -> None:
    meta = make_meta(dense=(1,))
    out = build(era, meta, make_routes(meta), faults=Faults(draft_layer0=3))
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
    with pytest.raises(RouteValidationError, match="dense"):
        validate_samples([s], meta)


@pytest.mark.parametrize("era", ALL_ERAS)
@pytest.mark.parametrize("rows", [0, 3])
def test_aborted_requests_are_masked_or_dropped(era: VllmEra, rows: int) -> None:
    meta = make_meta()
    out = build(era, meta, make_routes(meta), faults=Faults(abort_after_rows=rows))
    s = one(decode_vllm_output(out, DecodeOptions(meta=meta)))
    assert s.aborted
    assert s.routes_TLK.shape == (P + G, L, K)
    assert not s.valid_T.any()
    assert list(decode_vllm_output(out, DecodeOptions(meta=meta, on_abort="drop"))) == [None]
    batch = validate_samples([s], meta)
    assert not batch.valid_N.any()


@pytest.mark.parametrize("era", ALL_ERAS)
def test_missing_routes_of_a_finished_request_are_d3(era: VllmEra) -> None:
    meta = make_meta()
    out = build(era, meta, make_routes(meta), faults=Faults(missing=True))
    with pytest.raises(EngineOutputError, match=r"D3|preempted"):
        list(decode_vllm_output(out, DecodeOptions(meta=meta)))
    aborted = build(era, meta, make_routes(meta), faults=Faults(missing=True, abort_after_rows=0))
    assert not one(decode_vllm_output(aborted, DecodeOptions(meta=meta))).valid_T.any()


def test_abort_policy_is_checked() -> None:
    meta = make_meta()
    with pytest.raises(ValueError, match="on_abort"):
        list(
            decode_vllm_output(
                build(VllmEra.V0_14, meta, make_routes(meta)),
                DecodeOptions(meta=meta, on_abort="skip"),
            )
        )  # type: ignore[arg-type]
