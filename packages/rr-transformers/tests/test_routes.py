"""The token layout of route batches: ``routes_for_padded`` / ``routes_for_packed`` against a
naive per-token loop, ``arm_routes`` through the controller to ``router_topk``, and every fault
refused with an :class:`rr_core.AlignmentError` naming what came.

Shapes: B sequences, S padded length, N tokens the routers see, L layer slots, K top-k.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rr_core import AlignmentError, ReplayController, ReplayMode, RouteBatch, RouteMeta, router_topk
from rr_core.replay.controller import replayed_unchecked_ids
from rr_transformers import arm_routes, routes_for_packed, routes_for_padded
from rr_transformers._routes import rows_for_padded

E = 8
EXAMPLES = 300  # per property; each example is a few small tensor ops
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)


@dataclass
class Case:
    batch: RouteBatch
    tokens: list[int]  # tokens of each sequence the layout holds
    layout: torch.Tensor  # attention_mask [B, S] or position_ids [N] / [1, N]


def _ids(rng: np.random.Generator, rows: int, layers: int, k: int) -> np.ndarray:
    """K distinct ids per row and layer."""
    return rng.random((rows, layers, E)).argsort(-1)[..., :k].astype(np.int64)


def _batch(rng: np.random.Generator, tokens: list[int], k: int, layers: int) -> RouteBatch:
    """Each sequence gets T or T-1 rows (T-1 as an engine returns), some rows invalid."""
    meta = RouteMeta(
        num_experts=E, top_k=k, layer_axis="all_layers", layer_numbers=tuple(range(1, layers + 1))
    )
    rows = [max(t - int(rng.integers(0, 2)), 0) for t in tokens]
    seqs = [_ids(rng, r, layers, k) for r in rows]
    valid = [rng.random(r) < 0.8 for r in rows]
    return RouteBatch.from_sequences(seqs, meta, valid=valid, allow_all_zero=True)


@st.composite
def padded_cases(draw: st.DrawFn) -> Case:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = draw(st.lists(st.integers(0, 6), min_size=0, max_size=4))
    S = max(tokens, default=0) + draw(st.integers(0, 3))
    side = draw(st.sampled_from(["left", "right", "any"]))
    mask_BS = torch.zeros(len(tokens), S, dtype=torch.bool)
    for b, t in enumerate(tokens):
        if side == "right":
            mask_BS[b, :t] = True
        elif side == "left":
            mask_BS[b, S - t :] = True
        else:
            mask_BS[b, torch.from_numpy(rng.permutation(S)[:t])] = True
    dtype = draw(st.sampled_from([torch.bool, torch.int64, torch.int32, torch.float32]))
    batch = _batch(rng, tokens, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return Case(batch, tokens, mask_BS.to(dtype))


@st.composite
def packed_cases(draw: st.DrawFn) -> Case:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    pos_N = torch.cat([torch.arange(t) for t in tokens])
    if draw(st.booleans()):
        pos_N = pos_N[None]
    batch = _batch(rng, tokens, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return Case(batch, tokens, pos_N)


def _reference(batch: RouteBatch, positions: list[list[int]], n: int):
    """Row by row: sequence b's row t goes to its t-th token's position; nothing else routes."""
    _, L, K = batch.values_NLK.shape
    routes_NLK = torch.zeros(n, L, K, dtype=batch.values_NLK.dtype)
    replay_N = torch.zeros(n, dtype=torch.bool)
    for b, where in enumerate(positions):
        values_TLK, valid_T = batch.sequence(b)
        for t, pos in enumerate(where):
            if t < values_TLK.shape[0]:
                routes_NLK[pos] = values_TLK[t]
                replay_N[pos] = valid_T[t]
    return routes_NLK, replay_N


@PROPERTY
@given(padded_cases())
def test_padded_layout_matches_a_per_token_loop(case):
    mask = case.layout.to(torch.bool)
    B, S = mask.shape
    positions = [[b * S + s for s in range(S) if mask[b, s]] for b in range(B)]
    routes_NLK, replay_N = routes_for_padded(case.batch, case.layout)
    expected_NLK, expected_N = _reference(case.batch, positions, B * S)
    assert routes_NLK.dtype == case.batch.values_NLK.dtype
    assert torch.equal(routes_NLK, expected_NLK)
    assert torch.equal(replay_N, expected_N)


@PROPERTY
@given(padded_cases())
def test_the_padded_row_index_points_at_the_rows_the_layout_holds(case):
    """What arm_routes arms a padded batch with: an index into the batch's own rows that
    replays exactly the laid-out routes, and the same replay mask."""
    routes_NLK, replay_N = routes_for_padded(case.batch, case.layout)
    rows_N, index_replay_N = rows_for_padded(case.batch, case.layout)
    assert rows_N.dtype == torch.int64
    assert rows_N.shape == replay_N.shape
    assert torch.equal(index_replay_N, replay_N)
    if case.batch.values_NLK.shape[0]:
        assert int(rows_N.min()) >= 0
        assert int(rows_N.max()) < case.batch.values_NLK.shape[0]
        assert torch.equal(case.batch.values_NLK[rows_N][replay_N], routes_NLK[replay_N])


@PROPERTY
@given(packed_cases())
def test_packed_layout_matches_a_per_token_loop(case):
    starts = np.cumsum([0, *case.tokens])
    positions = [list(range(a, b)) for a, b in itertools.pairwise(starts)]
    routes_NLK, replay_N = routes_for_packed(case.batch, case.layout)
    expected_NLK, expected_N = _reference(case.batch, positions, int(starts[-1]))
    assert torch.equal(routes_NLK, expected_NLK)
    assert torch.equal(replay_N, expected_N)


@PROPERTY
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.data(),
    st.booleans(),
)
def test_a_sequence_with_too_many_or_too_few_rows_is_named(tokens, data, packed):
    """Rows must be T or T-1; the first sequence outside that is named with both counts."""
    bad = data.draw(st.integers(0, len(tokens) - 1))
    rows = list(tokens)
    t = tokens[bad]
    rows[bad] = data.draw(st.sampled_from([t + 1, t + 2, *range(max(t - 1, 0))]))
    for b in range(bad):
        rows[b] = data.draw(st.sampled_from([tokens[b], tokens[b] - 1]))
    meta = RouteMeta(num_experts=E, top_k=1, layer_axis="all_layers", layer_numbers=(1,))
    seqs = [np.ones((r, 1, 1), dtype=np.int64) for r in rows]
    batch = RouteBatch.from_sequences(seqs, meta)
    if packed:
        layout = torch.cat([torch.arange(n) for n in tokens])
        call = routes_for_packed
    else:
        layout = torch.zeros(len(tokens), max(tokens) + 1, dtype=torch.int64)
        for b, n in enumerate(tokens):
            layout[b, -n:] = 1  # left padding
        call = routes_for_padded
    with pytest.raises(AlignmentError, match=f"sequence {bad} has {t} tokens but {rows[bad]} "):
        call(batch, layout)


def _simple_batch(tokens: list[int], k: int = 2) -> RouteBatch:
    return _batch(np.random.default_rng(0), tokens, k, 2)


def test_sequence_count_mismatch_names_both_counts():
    batch = _simple_batch([3, 4])
    with pytest.raises(AlignmentError, match="holds 3 sequences; the route batch holds 2"):
        routes_for_padded(batch, torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(AlignmentError, match="holds 1 sequences; the route batch holds 2"):
        routes_for_packed(batch, torch.arange(4))


@pytest.mark.parametrize(
    "mask",
    [torch.ones(7), torch.ones(1, 2, 4), [[1, 1, 1]], None],
    ids=["1d", "3d", "list", "none"],
)
def test_attention_mask_of_the_wrong_shape_or_type(mask):
    with pytest.raises(AlignmentError, match=r"attention_mask must be a \[B, S\] tensor; got"):
        routes_for_padded(_simple_batch([3]), mask)


@pytest.mark.parametrize(
    "pos",
    [torch.arange(6).reshape(2, 3), torch.zeros(1, 1, 3), torch.tensor(0), torch.zeros(0), [0, 1]],
    ids=["two-rows", "3d", "scalar", "empty", "list"],
)
def test_position_ids_of_the_wrong_shape_or_type(pos):
    with pytest.raises(AlignmentError, match=r"position_ids must be \[N\] or \[1, N\]"):
        routes_for_packed(_simple_batch([3]), pos)


def test_position_ids_must_start_at_zero():
    with pytest.raises(AlignmentError, match="must start at 0; got 2"):
        routes_for_packed(_simple_batch([3]), torch.tensor([[2, 3, 4]]))


@pytest.mark.parametrize(
    "pos",
    [torch.tensor([0.0, 0.5, 2.0]), torch.tensor([False, True, True])],
    ids=["float", "bool"],
)
def test_position_ids_must_be_integer(pos):
    """0.5 or True is no position: such ids are a caller's mix-up, never one packed row."""
    with pytest.raises(AlignmentError, match="position_ids must be an integer tensor; got torch"):
        routes_for_packed(_simple_batch([3]), pos)


def test_routes_must_be_a_route_batch():
    with pytest.raises(AlignmentError, match=r"must be a rr_core\.RouteBatch; got Tensor"):
        routes_for_padded(torch.zeros(3, 2, 2), torch.ones(1, 3))  # type: ignore[arg-type]


# -- arm_routes through a controller ----------------------------------------------------------


def _controller(
    layers: tuple[int, ...], k: int = 2
) -> tuple[ReplayController, dict[int, nn.Module]]:
    routers = {n: nn.Linear(4, E) for n in layers}
    controller = ReplayController(num_experts=E, top_k=k)
    controller.attach(nn.ModuleList(routers.values()), walk=lambda _m: list(routers.items()))
    return controller, routers


def _sorted(ids_TK: torch.Tensor) -> torch.Tensor:
    return ids_TK.long().sort(-1).values


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("layout", ["left", "right", "packed"])
def test_arm_routes_gives_each_router_its_rows_and_native_elsewhere(layout, checked):
    """Routes on an all-layers axis whose first layer is dense: routers of layers 2 and 3 replay
    their slot on valid rows and route natively on padding, the last token and invalid rows.
    A batch that checked its ids arms them as checked (the replaying call's compiled path
    where numba runs), one built unchecked arms them unchecked."""
    rng = np.random.default_rng(5)
    meta = RouteMeta(
        num_experts=E, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2, 3),
        moe_layer_numbers=(2, 3),
    )  # fmt: skip
    tokens = [4, 2, 5]
    seqs = [_ids(rng, t - 1, 3, 2) for t in tokens]  # T-1 rows
    for s in seqs:
        s[:, 0] = 0  # the dense slot
    valid = [np.arange(t - 1) != 1 for t in tokens]  # row 1 of each invalid
    batch = RouteBatch.from_sequences(seqs, meta, valid=valid, validate=checked)
    S = max(tokens) + 1
    if layout == "packed":
        kw = {"position_ids": torch.cat([torch.arange(t) for t in tokens])[None]}
        positions = np.cumsum([0, *tokens])[:-1]
        where = [list(range(p, p + t)) for p, t in zip(positions, tokens, strict=True)]
        n = sum(tokens)
    else:
        mask = torch.zeros(len(tokens), S, dtype=torch.int64)
        for b, t in enumerate(tokens):
            if layout == "left":
                mask[b, S - t :] = 1
            else:
                mask[b, :t] = 1
        kw = {"attention_mask": mask}
        where = [[b * S + s for s in range(S) if mask[b, s]] for b in range(len(tokens))]
        n = len(tokens) * S
    controller, routers = _controller((2, 3))
    try:
        controller.set_mode(ReplayMode.REPLAY)
        arm_routes(controller, "mb", batch, **kw)
        generator = torch.Generator().manual_seed(6)
        scores = {layer: torch.randn(n, E, generator=generator) for layer in routers}
        with controller.microbatch("mb"):
            got = {layer: router_topk(r, scores[layer], 2).ids_TK for layer, r in routers.items()}
        assert replayed_unchecked_ids() is not checked
        report = controller.end_step()
    finally:
        controller.detach()
    for slot, layer in ((1, 2), (2, 3)):
        native_NK = scores[layer].topk(2).indices
        replayed = torch.zeros(n, dtype=torch.bool)
        for b, rows in enumerate(where):
            for t, pos in enumerate(rows[:-1]):
                if valid[b][t]:
                    replayed[pos] = True
                    got_K = _sorted(got[layer][pos]).tolist()
                    assert got_K == sorted(seqs[b][t, slot].tolist()), (layer, b, t)
        assert torch.equal(_sorted(got[layer][~replayed]), _sorted(native_NK[~replayed]))
        assert int(replayed.sum()) == sum(int(v.sum()) for v in valid)
    assert sorted(report.agreement) == [2, 3]


def test_arm_routes_takes_exactly_one_layout():
    controller, _ = _controller((1, 2))
    batch = _simple_batch([3])
    try:
        with pytest.raises(AlignmentError, match="exactly one of attention_mask"):
            arm_routes(controller, 0, batch)
        with pytest.raises(AlignmentError, match="exactly one of attention_mask"):
            arm_routes(
                controller, 0, batch, attention_mask=torch.ones(1, 3), position_ids=torch.arange(3)
            )
    finally:
        controller.detach()


def test_arm_routes_takes_a_route_batch():
    controller, _ = _controller((1, 2))
    try:
        with pytest.raises(AlignmentError, match=r"must be a rr_core\.RouteBatch; got Tensor"):
            arm_routes(controller, 0, torch.zeros(3, 2, 2), attention_mask=torch.ones(1, 3))
    finally:
        controller.detach()


@pytest.mark.parametrize(("e", "k"), [(16, 2), (8, 1)])
def test_arm_routes_refuses_routes_of_another_expert_count_or_top_k(e, k):
    controller = ReplayController(num_experts=e, top_k=k)
    routers = {1: nn.Linear(4, e), 2: nn.Linear(4, e)}
    controller.attach(nn.ModuleList(routers.values()), walk=lambda _m: list(routers.items()))
    try:
        with pytest.raises(
            AlignmentError,
            match=f"micro-batch 7: routes were captured with E=8, K=2; this model has E={e}, K={k}",
        ):
            arm_routes(controller, 7, _simple_batch([3]), attention_mask=torch.ones(1, 3))
    finally:
        controller.detach()
