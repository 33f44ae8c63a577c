"""TensorRT-LLM's routed experts (MoE layers only) decoded onto the all-layers axis.

Shapes: T tokens, L layer slots (all_layers axis), M MoE slots, K top-k, E experts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rr_core import AlignmentError, RouteValidationError
from rr_fakes.emulations.engines import (
    TrtllmCompletionOutput,
    TrtllmRequestOutput,
    trtllm_request_output,
)
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_trtllm_output,
    decode_trtllm_routes,
    validate_samples,
)
from vllm_testing import distinct_routes, make_meta

P, G = 5, 4
EXAMPLES = 200
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def result(meta, routes_TLK, **kw) -> TrtllmRequestOutput:
    return trtllm_request_output(
        list(range(100, 100 + P)), [(list(range(G)), routes_TLK)], meta.moe_slots, **kw
    )


@SETTINGS
@given(
    layers=st.integers(1, 6),
    dense_mask=st.integers(0, 63),
    top_k=st.integers(1, 4),
    num_experts=st.sampled_from([4, 8, 300]),
    p=st.integers(1, 6),
    g=st.integers(1, 5),
    dtype=st.sampled_from([np.int16, np.int32, np.int64, np.uint16]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_places_moe_columns_at_their_layers(
    layers, dense_mask, top_k, num_experts, p, g, dtype, seed
) -> None:
    dense = tuple(n for n in range(1, layers + 1) if dense_mask >> (n - 1) & 1)
    if len(dense) == layers:
        dense = dense[1:]  # a meta needs one MoE layer
    meta = make_meta(num_experts=num_experts, dense=dense, layers=layers, top_k=top_k)
    routes_TLK = distinct_routes(meta, p + g - 1, seed)
    out = trtllm_request_output(
        list(range(p)), [(list(range(g)), routes_TLK)], meta.moe_slots, dtype=dtype
    )
    assert out.outputs[0].routed_experts.shape == (p + g - 1, len(meta.moe_slots), top_k)
    (s,) = decode_trtllm_output(out, DecodeOptions(meta=meta))
    assert s is not None
    assert s.routes_TLK.shape == (p + g, layers, top_k)
    np.testing.assert_array_equal(s.routes_TLK[:-1], routes_TLK)
    assert s.valid_T.tolist() == [True] * (p + g - 1) + [False]
    assert not s.routes_TLK[:, list(meta.dense_slots)].any()
    batch = validate_samples([s], meta, allow_all_zero=True)  # tiny random samples
    assert batch.values_NLK.shape == (p + g, layers, top_k)
    np.testing.assert_array_equal(batch.values_NLK[:-1].numpy(), routes_TLK)


def test_several_completions_decode_in_order() -> None:
    meta = make_meta(dense=(1,))
    a, b = distinct_routes(meta, P + G - 1, 1), distinct_routes(meta, P + 1, 2)
    out = trtllm_request_output(list(range(P)), [(list(range(G)), a), ([7, 8], b)], meta.moe_slots)
    first, second = decode_trtllm_output(out, DecodeOptions(meta=meta))
    assert first is not None
    assert second is not None
    np.testing.assert_array_equal(first.routes_TLK[:-1], a)
    np.testing.assert_array_equal(second.routes_TLK[:-1], b)
    assert second.routes_TLK.shape[0] == P + 2


def test_all_layers_array_is_refused_naming_the_moe_axis() -> None:
    meta = make_meta(dense=(1, 2))
    routes_TLK = distinct_routes(meta, P + G - 1)
    with pytest.raises(EngineOutputError, match=r"expected \[rows, 2, 2\] \(2 MoE layers"):
        decode_trtllm_routes(
            routes_TLK, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
        ).only()


def test_moe_layers_meta_is_refused() -> None:
    meta = make_meta(dense=(1,))
    moe = type(meta)(
        num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=meta.moe_layer_numbers
    )
    rows = distinct_routes(meta, P + G - 1)[:, list(meta.moe_slots)]
    with pytest.raises(RouteValidationError, match="all_layers axis"):
        decode_trtllm_routes(
            rows, DecodeOptions(meta=moe), num_prompt_tokens=P, num_generated_tokens=G
        ).only()


def test_negative_ids_are_refused_not_read_as_cached_rows() -> None:
    meta = make_meta(dense=(1,))
    routes_TLK = distinct_routes(meta, P + G - 1)
    out = result(meta, routes_TLK)
    out.outputs[0].routed_experts[3] = -1
    with pytest.raises(EngineOutputError, match="row 3 holds a negative expert id"):
        decode_trtllm_output(out, DecodeOptions(meta=meta))


def test_ids_out_of_range_are_refused_by_validation() -> None:
    meta = make_meta(dense=(1,))
    out = result(meta, distinct_routes(meta, P + G - 1))
    out.outputs[0].routed_experts[2, 0, 0] = meta.num_experts
    (s,) = decode_trtllm_output(out, DecodeOptions(meta=meta))
    with pytest.raises(RouteValidationError):
        validate_samples([s], meta)


@pytest.mark.parametrize("rows", [P + G - 2, P + G + 1])
def test_wrong_row_count_is_refused(rows: int) -> None:
    meta = make_meta()
    with pytest.raises(AlignmentError, match=f"N={rows} route rows for T={P + G}"):
        decode_trtllm_output(result(meta, distinct_routes(meta, rows)), DecodeOptions(meta=meta))


def test_missing_routes_on_a_finished_request_is_d3() -> None:
    meta = make_meta()
    with pytest.raises(EngineOutputError, match="D3"):
        decode_trtllm_output(result(meta, None), DecodeOptions(meta=meta))


def test_cancelled_is_masked_or_dropped() -> None:
    meta = make_meta()
    out = result(meta, None, finish_reasons=["cancelled"])
    (masked,) = decode_trtllm_output(out, DecodeOptions(meta=meta))
    assert masked is not None
    assert masked.aborted
    assert not masked.valid_T.any()
    assert masked.routes_TLK.shape == (P + G, 4, 2)
    assert list(decode_trtllm_output(out, DecodeOptions(meta=meta, on_abort="drop"))) == [None]


def test_nested_lists_decode_like_arrays() -> None:
    meta = make_meta(dense=(2,))
    routes_TLK = distinct_routes(meta, P + G - 1)
    rows = routes_TLK[:, list(meta.moe_slots)].tolist()
    s = decode_trtllm_routes(
        rows, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
    ).only()
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[:-1], routes_TLK)


@pytest.mark.parametrize(
    "rows",
    [[[[1, 2]], [[3]]], "not routes", np.zeros((P + G - 1, 3, 2), dtype=np.float32)],
    ids=["ragged", "string", "float"],
)
def test_unreadable_routes_are_refused(rows: object) -> None:
    meta = make_meta(dense=(1,))
    with pytest.raises(EngineOutputError):
        decode_trtllm_routes(
            rows, DecodeOptions(meta=meta), num_prompt_tokens=P, num_generated_tokens=G
        ).only()


def test_object_without_the_fields_is_refused_by_name() -> None:
    meta = make_meta()
    with pytest.raises(EngineOutputError, match="has no attribute 'prompt_token_ids'"):
        decode_trtllm_output(object(), DecodeOptions(meta=meta))
    bare = TrtllmRequestOutput(0, [1, 2], [object()])  # type: ignore[list-item]
    with pytest.raises(EngineOutputError, match="has no attribute 'routed_experts'"):
        decode_trtllm_output(bare, DecodeOptions(meta=meta))
    assert isinstance(result(meta, None).outputs[0], TrtllmCompletionOutput)
