"""Property sweep of the route entry points (dtypes, RouteMeta, RouteBatch's constructors and
conversions, the route-row rule) and of R3 alignment: a checked result or an RRError.

The invariant every sweep checks, and the list of swept names: test_core_sweep.py; the generated
input: rr_core_testing.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

import rr_core
from rr_core import RouteBatch, RouteMeta
from rr_fakes.pytest_support import settles

from rr_core_testing import ANY_DTYPES, ANYTHING, JUNK, SWEEP, metas, tensors, valid_batches


@SWEEP
@given(E=ANYTHING, dtype=st.sampled_from(ANY_DTYPES))
def test_dtype_helpers(E: Any, dtype: torch.dtype) -> None:
    ok, out = settles(rr_core.narrowest_dtype, E)
    if ok:
        assert rr_core.holds_ids(out, E)
        assert out is torch.uint8 or not rr_core.holds_ids(torch.uint8, E)


@SWEEP
@given(ids=ANYTHING, E=st.one_of(st.integers(-2, 70000), JUNK))
def test_narrow_ids(ids: Any, E: Any) -> None:
    ok, out = settles(rr_core.narrow_ids, ids, E)
    if ok:
        assert out.dtype == rr_core.narrowest_dtype(E)
        assert torch.equal(out.to(torch.int64), torch.as_tensor(ids).to(torch.int64))


@SWEEP
@given(
    E=st.one_of(st.integers(-1, 300), JUNK),
    K=st.one_of(st.integers(-1, 5), JUNK),
    axis=st.one_of(st.sampled_from(["all_layers", "moe_layers", "stage", "bogus"]), JUNK),
    layers=st.one_of(st.lists(st.integers(-1, 6), max_size=5).map(tuple), JUNK),
    moe=st.one_of(st.none(), st.lists(st.integers(-1, 6), max_size=5).map(tuple), JUNK),
)
def test_route_meta(E: Any, K: Any, axis: Any, layers: Any, moe: Any) -> None:
    ok, meta = settles(
        RouteMeta,
        num_experts=E,
        top_k=K,
        layer_axis=axis,
        layer_numbers=layers,
        moe_layer_numbers=moe,
    )
    if ok:
        assert 1 <= meta.top_k <= meta.num_experts
        assert set(meta.routed_layer_numbers) <= set(meta.layer_numbers)
        assert sorted(meta.moe_slots + meta.dense_slots) == list(range(len(meta.layer_numbers)))


def _ids_ok(values: torch.Tensor, valid: torch.Tensor, meta: RouteMeta) -> bool:
    """The validate invariant: valid rows' MoE slots hold distinct ids in [0, E)."""
    rows = values[valid][:, list(meta.moe_slots)].to(torch.int64)
    if rows.numel() == 0:
        return True
    in_range = bool(((rows >= 0) & (rows < meta.num_experts)).all())
    distinct = bool((rows.sort(-1).values.diff(dim=-1) != 0).all()) if meta.top_k > 1 else True
    return in_range and distinct


@SWEEP
@given(
    meta=metas(),
    values=tensors(),
    offsets=st.one_of(st.lists(st.integers(-2, 8), max_size=4), JUNK, tensors(max_dims=2)),
    valid=st.one_of(st.none(), tensors(max_dims=2), JUNK),
)
def test_route_batch_init(meta: RouteMeta, values: Any, offsets: Any, valid: Any) -> None:
    ok, batch = settles(RouteBatch, values, offsets, valid, meta)
    if ok:
        assert batch.values_NLK.dim() == 3
        assert batch.offsets_B1[0] == 0
        assert batch.offsets_B1[-1] == batch.values_NLK.shape[0]
        assert _ids_ok(batch.values_NLK, batch.valid_N, meta)


@SWEEP
@given(meta=metas(), seqs=st.one_of(st.lists(ANYTHING, max_size=3), JUNK), data=st.data())
def test_from_sequences(meta: RouteMeta, seqs: Any, data: st.DataObject) -> None:
    valid = data.draw(st.one_of(st.none(), st.lists(ANYTHING, max_size=3)))
    ok, batch = settles(RouteBatch.from_sequences, seqs, meta, valid=valid)
    if ok:
        assert batch.num_sequences == len(seqs)
        assert _ids_ok(batch.values_NLK, batch.valid_N, meta)


@SWEEP
@given(meta=metas(), padded=tensors(max_dims=5), mask=tensors(max_dims=3), data=st.data())
def test_from_padded(meta: RouteMeta, padded: Any, mask: Any, data: st.DataObject) -> None:
    valid = data.draw(st.one_of(st.none(), tensors(max_dims=3)))
    ok, batch = settles(RouteBatch.from_padded, padded, mask, meta, valid_BS=valid)
    if ok:
        assert batch.num_sequences == padded.shape[0]
        assert _ids_ok(batch.values_NLK, batch.valid_N, meta)


@SWEEP
@given(batch=valid_batches(), side=st.one_of(st.sampled_from(["left", "right"]), JUNK))
def test_batch_round_trips(batch: RouteBatch, side: Any) -> None:
    batch.validate(allow_all_zero=True)
    ok, out = settles(batch.to_padded, padding_side=side)
    if ok:
        padded, valid = out
        assert padded.shape[0] == batch.num_sequences
        assert int(valid.sum()) == int(batch.valid_N.sum())
        assert torch.equal(padded[valid], batch.values_NLK[batch.valid_N])
    for i in (-1, batch.num_sequences, None, "0"):
        ok, _ = settles(batch.sequence, i)


@SWEEP
@given(
    rows=st.one_of(st.integers(-3, 12), JUNK),
    T=st.one_of(st.integers(-3, 12), JUNK),
    ps=st.one_of(st.integers(-3, 12), JUNK),
)
def test_route_rows(rows: Any, T: Any, ps: Any) -> None:
    ok, n = settles(rr_core.expected_route_rows, T, prompt_start=ps)
    if ok:
        assert n == max(T - 1 - ps, 0)
        rr_core.check_route_rows(n, T, prompt_start=ps)
    settles(rr_core.check_route_rows, rows, T, prompt_start=ps)


@SWEEP
@given(
    routes=st.one_of(tensors(max_dims=4, high=8), JUNK),
    T=st.one_of(st.integers(-2, 8), JUNK),
    ps=st.one_of(st.integers(-2, 8), JUNK),
)
def test_align_routes(routes: Any, T: Any, ps: Any) -> None:
    ok, out = settles(rr_core.align_routes, routes, T, prompt_start=ps)
    if ok:
        routes_TLK, mask_T = out
        assert routes_TLK.shape[0] == T
        assert mask_T.shape == (T,)
        assert mask_T.dtype == torch.bool
        assert torch.equal(routes_TLK[mask_T].to(torch.int64), routes.to(torch.int64))
        assert not routes_TLK[~mask_T].any()


@SWEEP
@given(
    routes=st.one_of(tensors(max_dims=4, high=8), JUNK),
    mask=st.one_of(tensors(max_dims=2), JUNK),
    n=st.one_of(st.integers(-2, 9), JUNK),
)
def test_truncate_and_pad(routes: Any, mask: Any, n: Any) -> None:
    ok, out = settles(rr_core.truncate_routes, routes, mask, n)
    if ok:
        assert out[0].shape[0] == n == out[1].shape[0]
    ok, out = settles(rr_core.pad_rows, routes, mask, n)
    if ok:
        assert out[0].shape[0] % n == 0
        assert out[0].shape[0] - routes.shape[0] < n
        assert torch.equal(out[0][: routes.shape[0]], routes)
        assert not out[1][routes.shape[0] :].any()


@SWEEP
@given(
    lengths=st.one_of(st.lists(st.integers(-2, 6), max_size=4), tensors(max_dims=2, high=6), JUNK),
    missing_last=st.booleans(),
)
def test_replay_mask_for_lengths(lengths: Any, missing_last: bool) -> None:
    ok, mask = settles(rr_core.replay_mask_for_lengths, lengths, missing_last=missing_last)
    if ok:
        lens = [int(n) for n in lengths]
        assert mask.dtype == torch.bool
        assert mask.shape == (sum(lens),)
        assert int(mask.sum()) == sum(max(n - missing_last, 0) for n in lens)
