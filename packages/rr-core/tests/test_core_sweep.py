"""Property sweep over rr_core's data-facing entry points: every call on generated input, valid
or not, returns a result that passes the entry point's own invariant or raises an RRError
subclass, never a bare IndexError/RuntimeError/KeyError/TypeError from inside, never a silently
wrong answer.

Entry points covered:

- routes: ``narrowest_dtype``, ``holds_ids``, ``narrow_ids``, ``RouteMeta``,
  ``RouteBatch`` (``__init__``, ``from_sequences``, ``from_padded``, ``validate``,
  ``to_padded``, ``sequence``), ``expected_route_rows``, ``check_route_rows``
- codecs: ``encode_routes``, ``decode_routes``, ``decode_routes_into``, ``bytes_per_token``,
  ``payload_bytes``
- R3 alignment: ``align_routes``, ``truncate_routes``, ``pad_rows``, ``replay_mask_for_lengths``
- layout: ``LayoutConfig``, ``moe_layer_numbers``, ``is_moe_layer``, ``moe_ordinal``,
  ``stage_layer_numbers``, ``layer_offset``, ``num_layers_to_build``, ``stage_of_layer``,
  ``all_layers_to_moe_layers``, ``moe_layers_to_all_layers``, ``select_stage``
- replay: ``native_topk``, ``replay_topk``, ``ReplayController`` (constructor, ``set_mode``,
  ``arm``, ``arm_batch``, ``recorded``), a replayed forward of armed routes
- ``failure_mode``
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rr_core
from rr_core import (
    CODECS,
    LayoutConfig,
    ReplayController,
    ReplayMode,
    RouteBatch,
    RouteMeta,
    RRError,
)
from rr_fakes.pytest_support import settles
from rr_fakes.sweeps import public_api_tests

from rr_core_testing import TinyModel

SWEEP = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Values of the wrong kind for any argument.
JUNK = st.sampled_from(
    [None, -1, 0, 1.5, "x", b"x", [], [1, "a"], (), {}, object(), float("nan"), True, 2**70]
)
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
ANY_DTYPES = [*INT_DTYPES, torch.float32, torch.float16, torch.bool]


@st.composite
def tensors(draw: st.DrawFn, *, max_dims: int = 4, high: int = 300) -> torch.Tensor:
    dtype = draw(st.sampled_from(ANY_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=4))
    if dtype.is_floating_point:
        values = draw(hnp.arrays(np.float32, shape, elements=st.floats(-2, high, width=32)))
        return torch.from_numpy(values).to(dtype)
    if dtype is torch.bool:
        return torch.from_numpy(draw(hnp.arrays(np.bool_, shape)))
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -3), min(info.max, high)
    values = draw(hnp.arrays(np.int64, shape, elements=st.integers(lo, hi)))
    return torch.from_numpy(values).to(dtype)


ANYTHING = st.one_of(JUNK, tensors(), st.integers(-5, 400))


@st.composite
def metas(draw: st.DrawFn) -> RouteMeta:
    E = draw(st.integers(1, 300))
    K = draw(st.integers(1, min(E, 4)))
    L = draw(st.integers(1, 4))
    numbers = tuple(range(1, L + 1))
    moe = draw(st.one_of(st.none(), st.sets(st.sampled_from(numbers), min_size=1)))
    return RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis="all_layers",
        layer_numbers=numbers,
        moe_layer_numbers=None if moe is None else tuple(sorted(moe)),
    )


@st.composite
def valid_batches(draw: st.DrawFn) -> RouteBatch:
    meta = draw(metas())
    E, K, L = meta.num_experts, meta.top_k, len(meta.layer_numbers)
    lengths = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    seqs = []
    for n in lengths:
        ids = np.array([rng.permutation(E)[:K] for _ in range(n * L)]).reshape(n, L, K)
        ids[:, list(meta.dense_slots)] = 0
        seqs.append(ids.astype(np.int64))
    valid = [rng.random(n) < 0.8 for n in lengths]
    return RouteBatch.from_sequences(seqs, meta, valid=valid, allow_all_zero=True)


# --- routes -----------------------------------------------------------------------------------


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


# --- codecs -----------------------------------------------------------------------------------


@SWEEP
@given(batch=valid_batches(), codec=st.one_of(st.sampled_from([*CODECS, "zip"]), JUNK))
def test_codec_round_trip(batch: RouteBatch, codec: Any) -> None:
    ok, enc = settles(rr_core.encode_routes, batch, codec)
    if not ok:
        return
    dec = rr_core.decode_routes(enc)
    assert torch.equal(dec.valid_N, batch.valid_N)
    mine = batch.values_NLK[batch.valid_N].to(torch.int64)
    theirs = dec.values_NLK[dec.valid_N].to(torch.int64)
    if codec == "set":
        mine, theirs = mine.sort(-1).values, theirs.sort(-1).values
    assert torch.equal(mine, theirs)
    assert enc.nbytes >= rr_core.payload_bytes(batch.meta, codec, int(batch.valid_N.sum()))


@SWEEP
@given(
    batch=valid_batches(),
    codec=st.sampled_from(list(CODECS)),
    dtype=st.sampled_from(ANY_DTYPES),
    extra=st.integers(-1, 2),
    rows=st.one_of(st.none(), tensors(max_dims=2, high=12), JUNK),
)
def test_decode_into(batch: RouteBatch, codec: str, dtype: Any, extra: int, rows: Any) -> None:
    enc = rr_core.encode_routes(batch, codec)
    N, L, K = batch.values_NLK.shape
    out = torch.full((max(N + extra, 0), L, K), 7, dtype=dtype)
    ok, got = settles(rr_core.decode_routes_into, enc, out, rows_V=rows)
    if ok and rows is None:
        assert got is out
        v = batch.valid_N
        mine, theirs = batch.values_NLK[v].to(torch.int64), got[v].to(torch.int64)
        moe = list(batch.meta.moe_slots)
        mine, theirs = mine[:, moe], theirs[:, moe]
        if codec == "set":
            mine, theirs = mine.sort(-1).values, theirs.sort(-1).values
        assert torch.equal(mine, theirs)
    settles(rr_core.decode_routes_into, enc, rows if rows is not None else 3)


@SWEEP
@given(meta=metas(), codec=st.one_of(st.sampled_from([*CODECS, "zip"]), JUNK), n=ANYTHING)
def test_codec_sizes(meta: RouteMeta, codec: Any, n: Any) -> None:
    ok, size = settles(rr_core.bytes_per_token, meta, codec)
    if ok:
        assert size >= 0  # 0 bits per id for a single expert under packed
    ok, size = settles(rr_core.payload_bytes, meta, codec, n)
    if ok:
        assert size >= 0
    settles(rr_core.encode_routes, n)
    settles(rr_core.decode_routes, n)


# --- R3 alignment ---------------------------------------------------------------------------


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


# --- layout ---------------------------------------------------------------------------------


@st.composite
def layout_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    small = st.one_of(st.integers(-1, 8), JUNK) if draw(st.booleans()) else st.integers(1, 8)
    kwargs: dict[str, Any] = {"num_layers": draw(small)}
    if draw(st.booleans()):
        kwargs["pp_size"] = draw(small)
    if draw(st.booleans()):
        kwargs["vp_size"] = draw(st.one_of(st.none(), small))
    if draw(st.booleans()):
        kwargs["moe_layer_freq"] = draw(
            st.one_of(small, st.lists(st.integers(-1, 2), max_size=8), JUNK)
        )
    return kwargs


@SWEEP
@given(kwargs=layout_kwargs(), layer=st.one_of(st.integers(-1, 10), JUNK), rank=ANYTHING)
def test_layout(kwargs: dict[str, Any], layer: Any, rank: Any) -> None:
    try:
        cfg = LayoutConfig(**kwargs)
    except RRError:
        return
    except TypeError as e:  # an unknown keyword is Python's own refusal
        pytest.fail(f"LayoutConfig({kwargs}) raised {e!r}")
    ok, moe = settles(rr_core.moe_layer_numbers, cfg)
    if not ok:
        return
    assert all(1 <= n <= cfg.num_layers for n in moe)
    ok, is_moe = settles(rr_core.is_moe_layer, cfg, layer)
    if ok:
        assert is_moe == (layer in moe)
    ok, ordinal = settles(rr_core.moe_ordinal, cfg, layer)
    if ok:
        assert moe[ordinal] == layer
    ok, stage = settles(rr_core.stage_of_layer, cfg, layer)
    if ok:
        assert layer in rr_core.stage_layer_numbers(cfg, stage[0], stage[1])
    ok, numbers = settles(rr_core.stage_layer_numbers, cfg, rank)
    if ok:
        assert len(numbers) == rr_core.num_layers_to_build(cfg, rank)
        if numbers:
            assert numbers[0] == rr_core.layer_offset(cfg, rank) + 1


@SWEEP
@given(
    num_layers=st.integers(1, 6),
    freq=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    routes=st.one_of(tensors(max_dims=4, high=8), JUNK),
    rank=st.one_of(st.integers(-1, 3), JUNK),
)
def test_axis_helpers(num_layers: int, freq: list[int], routes: Any, rank: Any) -> None:
    freq = freq[:num_layers]
    if not any(freq):
        freq[0] = 1
    cfg = LayoutConfig(num_layers=num_layers, moe_layer_freq=freq)
    ok, out = settles(rr_core.all_layers_to_moe_layers, routes, cfg)
    if ok:
        assert out.shape[-2] == sum(freq)
        back = rr_core.moe_layers_to_all_layers(out, cfg)
        moe = [i for i, f in enumerate(freq) if f]
        assert torch.equal(back[..., moe, :], routes[..., moe, :])
    ok, out = settles(rr_core.moe_layers_to_all_layers, routes, cfg)
    if ok:
        assert out.shape[-2] == num_layers
    for axis in ("all_layers", "moe_layers", "stage", None):
        ok, out = settles(rr_core.select_stage, routes, cfg, axis, rank)
        if ok:
            assert out.shape[-2] <= routes.shape[-2]


# --- replay ---------------------------------------------------------------------------------


@SWEEP
@given(
    scores=tensors(max_dims=3),
    k=st.one_of(st.integers(-1, 5), JUNK),
    target=st.one_of(st.none(), tensors(max_dims=3, high=8), JUNK),
    mask=st.one_of(st.none(), tensors(max_dims=2), JUNK),
)
def test_topk(scores: Any, k: Any, target: Any, mask: Any) -> None:
    ok, out = settles(rr_core.native_topk, scores, k)
    if ok:
        assert out.ids_TK.shape == (*scores.shape[:-1], k)
    if isinstance(target, torch.Tensor) and target.dtype in INT_DTYPES and scores.dim():
        # ids are the caller's to check (the controller validates them once per micro-batch)
        target = target.to(torch.int64).clamp(0, max(scores.shape[-1] - 1, 0))
    ok, out = settles(rr_core.replay_topk, scores, k, target_ids_TK=target, replay_mask_T=mask)
    if ok and target is not None:
        rows = slice(None) if mask is None else mask
        assert torch.equal(out.ids_TK[rows].to(torch.int64), target[rows].to(torch.int64))
        assert torch.equal(out.values_TK, scores.gather(-1, out.ids_TK))


@SWEEP
@given(E=ANYTHING, K=ANYTHING, agreement=st.one_of(st.sampled_from([True, False, "exact"]), JUNK))
def test_controller_init(E: Any, K: Any, agreement: Any) -> None:
    ok, ctrl = settles(ReplayController, num_experts=E, top_k=K, measure_agreement=agreement)
    if ok:
        assert 1 <= ctrl.top_k <= ctrl.num_experts
        ok, _ = settles(ctrl.set_mode, ReplayMode.REPLAY)  # nothing attached
        assert not ok


@pytest.fixture(scope="module")
def tiny() -> TinyModel:
    torch.manual_seed(0)
    return TinyModel(num_layers=3)


@SWEEP
@given(
    mb=st.one_of(st.integers(0, 2), st.just([]), JUNK),
    routes=st.one_of(tensors(max_dims=4, high=8), JUNK),
    layers=st.one_of(st.just("walked"), st.lists(st.integers(-1, 4), max_size=4), JUNK),
    mask=st.one_of(st.none(), tensors(max_dims=2), JUNK),
    rows=st.one_of(st.none(), tensors(max_dims=2, high=6), JUNK),
    validate=st.booleans(),
)
def test_controller_arm(
    tiny: TinyModel, mb: Any, routes: Any, layers: Any, mask: Any, rows: Any, validate: bool
) -> None:
    from rr_core_testing import E, H, K

    ctrl = ReplayController(num_experts=E, top_k=K)
    walked = ctrl.attach(tiny)
    try:
        ctrl.set_mode(ReplayMode.REPLAY)
        numbers = walked if layers == "walked" else layers
        ok, _ = settles(
            ctrl.arm, mb, routes, layer_numbers=numbers, replay_mask_T=mask, rows_T=rows,
            validate=validate,
        )  # fmt: skip
        if not ok:
            return
        T = routes.shape[0] if rows is None else rows.shape[0]
        x = torch.randn(T, H)
        try:
            with torch.no_grad(), ctrl.microbatch(mb):
                tiny(x)
        except RRError:
            return
        for layer in tiny.decoder.layers:
            if layer.router is None:
                continue
            slot = list(numbers).index(layer.layer_number)
            source = routes if rows is None else routes[rows]
            want = source[:, slot].to(torch.int64)
            rowsel = slice(None) if mask is None else mask
            assert torch.equal(layer.last_ids_TK[rowsel], want[rowsel])
        settles(ctrl.end_step)
    finally:
        ctrl.detach()


@SWEEP
@given(batch=st.one_of(valid_batches(), JUNK), mb=st.integers(0, 1))
def test_controller_arm_batch_and_record(tiny: TinyModel, batch: Any, mb: int) -> None:
    from rr_core_testing import E, K

    ctrl = ReplayController(num_experts=E, top_k=K)
    ctrl.attach(tiny)
    try:
        ctrl.set_mode(ReplayMode.REPLAY)
        settles(ctrl.arm_batch, mb, batch)
        settles(ctrl.end_step)
        for dtype in (*ANY_DTYPES, "int8", None, torch.complex64):
            settles(ctrl.recorded, mb, dtype=dtype)
    finally:
        ctrl.detach()


@SWEEP
@given(code=st.one_of(st.sampled_from(sorted(rr_core.FAILURE_MODES)), st.text(max_size=4), JUNK))
def test_failure_mode(code: Any) -> None:
    ok, mode = settles(rr_core.failure_mode, code)
    if ok and mode is not None:
        assert mode.title
        assert mode.handling


#: The entry points the sweeps above drive with generated routes and layouts, checking their
#: invariant.
SWEPT_ABOVE = (
    "LayoutConfig", "ReplayController", "ReplayMode", "RouteBatch", "RouteMeta", "align_routes",
    "all_layers_to_moe_layers", "bytes_per_token", "check_route_rows", "decode_routes",
    "decode_routes_into", "encode_routes", "expected_route_rows", "failure_mode", "holds_ids",
    "is_moe_layer", "layer_offset", "moe_layer_numbers", "moe_layers_to_all_layers",
    "moe_ordinal", "narrow_ids", "narrowest_dtype", "native_topk", "num_layers_to_build",
    "pad_rows", "payload_bytes", "replay_mask_for_lengths", "replay_topk", "select_stage",
    "stage_layer_numbers", "stage_of_layer", "truncate_routes",
)  # fmt: skip
#: Entry points whose invariant on arguments of any kind is "a result or an rr error" (paths
#: among them: each example runs in a fresh empty directory).
SWEPT_WITH_JUNK = (
    "RouteIndex", "atomic_write", "controller_of", "decoder_scope", "find_orphans",
    "load_routes", "load_samples", "moe_ordinals_of_stage", "moe_pattern", "num_moe_layers",
    "read_header", "router_topk", "save_routes", "stage_moe_layer_numbers", "take_sequences",
    "walk_routers", "write_index", "write_shard",
)  # fmt: skip
#: Public names that take no outside data.
NOT_ENTRY_POINTS = {
    **dict.fromkeys(
        ("Attachment", "StepReport", "TopK", "RecordHeader", "FailureMode"),
        "a record rr builds and returns",
    ),
    "EncodedRoutes": "what encode_routes builds; decode_routes checks every field (swept above)",
    "Adapter": "the adapter base class: tests/test_adapter_protocol.py drives every adapter",
    **dict.fromkeys(("CodecName", "LayerAxis", "PaddingSide", "RouterPredicate"), "a type alias"),
    **dict.fromkeys(("CODECS", "FAILURE_MODES"), "a constant"),
    **dict.fromkeys(
        (
            "AlignmentError",
            "CodecError",
            "LayoutError",
            "RRError",
            "RRWarning",
            "RecordFileError",
            "ReplayError",
            "RouteValidationError",
            "WalkError",
        ),
        "an error or warning class",
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rr_core,
    swept_above=SWEPT_ABOVE,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_ENTRY_POINTS,
)
