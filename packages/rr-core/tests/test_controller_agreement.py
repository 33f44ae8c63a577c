"""The step report's agreement: the threshold test on the router's own scores counts what a
second native top-k counts, and where they may differ (a tie at the set's lowest score); the
order agreement counts the rows whose replayed slots are also in the router's score order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rr_core import (
    ReplayController,
    ReplayError,
    ReplayMode,
    RouteBatch,
    RouteMeta,
    kernels,
    load_routes,
    read_header,
    router_topk,
    save_routes,
)
from rr_core.replay import tally
from rr_core.replay.topk import is_topk_set_T, topk_set_and_order_T

from rr_core_testing import RouterCall, router_calls

#: The score dtypes a router hands the top-k step.
SCORE_DTYPES = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])


class ScoreRouter(nn.Module):
    """A router whose scores the test hands it."""

    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number

    def forward(self, scores_TE: torch.Tensor, k: int) -> torch.Tensor:
        return router_topk(self, scores_TE, k).ids_TK


def replayed_agreement(
    scores_TE: torch.Tensor,
    targets_TK: torch.Tensor,
    mask_T: torch.Tensor | None,
    measure: Any,
    rows_T: torch.Tensor | None = None,
) -> dict[int, float]:
    router = ScoreRouter(1)
    k = targets_TK.shape[1]
    ctrl = ReplayController(num_experts=scores_TE.shape[1], top_k=k, measure_agreement=measure)
    try:
        ctrl.attach(nn.ModuleList([router]))
        ctrl.set_mode(ReplayMode.REPLAY)
        routes = targets_TK[:, None].to(torch.uint8)
        ctrl.arm(0, routes, layer_numbers=[1], replay_mask_T=mask_T, rows_T=rows_T)
        router(scores_TE, k)
        report = ctrl.end_step()
        assert set(report.order_agreement) == set(report.agreement)
        assert all(report.order_agreement[n] <= a for n, a in report.agreement.items())
        return report.agreement
    finally:
        ctrl.detach()


@settings(max_examples=60, deadline=None)
@given(call=router_calls(rows=(1, 40), experts=(2, 32)), masked=st.booleans())
def test_the_threshold_test_counts_what_a_second_topk_counts(
    call: RouterCall, masked: bool
) -> None:
    t, e, k, seed = call
    g = torch.Generator().manual_seed(seed)
    scores = torch.softmax(torch.randn(t, e, generator=g) * 3, dim=-1)  # no ties (continuous)
    native = scores.topk(k, dim=-1).indices
    other = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
    keep_T1 = (torch.rand(t, generator=g) < 0.5)[:, None]
    targets = torch.where(keep_T1, native.flip(-1), other)  # order within a set is no matter
    mask = torch.rand(t, generator=g) < 0.8 if masked else None
    replayed = torch.ones(t, dtype=torch.bool) if mask is None else mask
    same_T = (targets.sort(-1).values == native.sort(-1).values).all(-1)
    expected = int((same_T & replayed).sum()) / int(replayed.sum()) if replayed.any() else None
    for measure in (True, "exact"):
        agreement = replayed_agreement(scores, targets, mask, measure)
        assert agreement == ({} if expected is None else {1: expected}), measure


def test_a_tie_at_the_lowest_score_counts_as_agreeing() -> None:
    scores = torch.tensor([[0.4, 0.3, 0.3, 0.0]])
    assert is_topk_set_T(scores, torch.tensor([[0, 1]])).tolist() == [True]
    assert is_topk_set_T(scores, torch.tensor([[2, 0]])).tolist() == [True]
    assert is_topk_set_T(scores, torch.tensor([[1, 2]])).tolist() == [False]
    assert is_topk_set_T(scores, torch.tensor([[0, 3]])).tolist() == [False]
    # the second top-k picks one of the tied experts: only that one agrees there
    picked = int(scores.topk(2).indices[0, 1])
    unpicked = 3 - picked
    assert replayed_agreement(scores, torch.tensor([[0, unpicked]]), None, True) == {1: 1.0}
    assert replayed_agreement(scores, torch.tensor([[0, unpicked]]), None, "exact") == {1: 0.0}


@settings(max_examples=80, deadline=None)
@given(call=router_calls(rows=(0, 9), experts=(1, 12)), dtype=SCORE_DTYPES, data=st.data())
def test_every_kernel_family_gives_the_same_tests(
    call: RouterCall, dtype: torch.dtype, data: st.DataObject
) -> None:
    """The compiled pass (numba, CPU float scores) and the torch ops agree row for row, ties
    (scores drawn from a few values) and unordered slots included."""
    rows, experts, k, _ = call
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0])
    scores = torch.tensor(
        data.draw(
            st.lists(
                st.lists(values, min_size=experts, max_size=experts), min_size=rows, max_size=rows
            )
        ),
        dtype=dtype,
    ).reshape(rows, experts)
    ids = (
        torch.stack([torch.randperm(experts)[:k] for _ in range(rows)])
        if rows
        else torch.zeros(0, k, dtype=torch.int64)
    )
    results = {}
    for family in kernels.KERNELS if kernels.numba_available() else ("numpy",):
        with kernels.use_kernel(family):
            results[family] = topk_set_and_order_T(scores, ids)
    numpy_agree, numpy_order = results["numpy"]
    for agree, order in results.values():
        assert torch.equal(agree, numpy_agree)
        assert torch.equal(order, numpy_order)
    best_outside = [
        max((float(scores[t, e]) for e in range(experts) if e not in ids[t]), default=float("-inf"))
        for t in range(rows)
    ]
    floor = [min(float(scores[t, i]) for i in ids[t]) for t in range(rows)]
    assert numpy_agree.tolist() == [b <= f for b, f in zip(best_outside, floor, strict=True)]


def test_no_agreement_is_measured_when_turned_off() -> None:
    scores = torch.softmax(torch.randn(5, 8), dim=-1)
    assert replayed_agreement(scores, scores.topk(2).indices, None, False) == {}


def test_agreement_counts_rows_armed_through_a_row_index() -> None:
    scores = torch.softmax(torch.randn(6, 8, generator=torch.Generator().manual_seed(4)), -1)
    native = scores.topk(2).indices
    source = torch.stack([native[0], native[3], (native[5] + 1) % 8])  # 3 source rows
    rows = torch.tensor([0, 0, 0, 1, 0, 2])  # router rows 1, 2 and 4 are padding
    mask = torch.tensor([True, False, False, True, False, True])
    for measure in (True, "exact"):
        # row 0 and row 3 replay their native set, row 5 another one
        assert replayed_agreement(scores, source, mask, measure, rows) == {1: 2 / 3}


@pytest.mark.parametrize("measure", ["yes", "threshold", 1, 0, None, 0.5])
def test_measure_agreement_takes_only_its_values(measure: Any) -> None:
    with pytest.raises(ReplayError, match="measure_agreement must be True"):
        ReplayController(num_experts=8, top_k=2, measure_agreement=measure)


@pytest.mark.parametrize("measure", [True, "exact"])
def test_order_agreement_counts_the_slot_order_the_set_agreement_ignores(measure: Any) -> None:
    """Engines return ids in top-k order; the trainer's router may rank the same set another
    way. Such rows agree as sets, not in order: what slot-ordered consumers would see."""
    e, k = 8, 3
    scores = torch.softmax(torch.randn(6, e, generator=torch.Generator().manual_seed(0)), -1)
    native = scores.topk(k, dim=-1).indices
    swapped = native.clone()
    swapped[::2] = native[::2].flip(-1)  # rows 0, 2, 4: same set, lowest first
    router = ScoreRouter(1)
    ctrl = ReplayController(num_experts=e, top_k=k, measure_agreement=measure)
    try:
        ctrl.attach(nn.ModuleList([router]))
        ctrl.set_mode(ReplayMode.REPLAY)
        ctrl.arm(0, swapped[:, None].to(torch.uint8), layer_numbers=[1])
        assert torch.equal(router(scores, k), swapped)  # replayed in the armed slot order
        report = ctrl.end_step()
    finally:
        ctrl.detach()
    assert report.agreement == {1: 1.0}
    assert report.order_agreement == {1: 0.5}


def test_the_report_puts_agreement_beside_the_provenance_of_the_routes(tmp_path: Path) -> None:
    """Routes saved with their engine's provenance, loaded and armed with it: the step report
    names the engine and its settings beside each layer's agreement, so a drop after an engine
    upgrade can be attributed."""
    e, k = 8, 2
    scores = torch.softmax(torch.randn(5, e, generator=torch.Generator().manual_seed(1)), -1)
    meta = RouteMeta(num_experts=e, top_k=k, layer_axis="moe_layers", layer_numbers=(1,))
    ids = scores.topk(k, dim=-1).indices[:, None].to(torch.uint8)
    provenance = {"engine": "vllm", "engine_version": "0.30.0", "routing_precision": "bfloat16"}
    path = save_routes(
        tmp_path / "r.rr", RouteBatch(ids, [0, 5], None, meta), provenance=provenance
    )
    header = read_header(path)
    router = ScoreRouter(1)
    ctrl = ReplayController(num_experts=e, top_k=k)
    try:
        ctrl.attach(nn.ModuleList([router]))
        ctrl.set_mode(ReplayMode.REPLAY)
        with pytest.raises(ReplayError, match="provenance must map setting names"):
            ctrl.arm_batch(0, load_routes(path), provenance=["vllm"])  # type: ignore[arg-type]
        ctrl.arm_batch(0, load_routes(path), provenance=header.provenance)
        router(scores, k)
        report = ctrl.end_step()
    finally:
        ctrl.detach()
    assert report.provenance == (provenance,)
    assert report.summary().splitlines() == [
        "layer 1: agreement 1.0000, in order 1.0000",
        "routes from: engine=vllm, engine_version=0.30.0, routing_precision=bfloat16",
    ]


#: the kernel families a controller can count agreement with here (numba: on the host as each
#: call runs; numpy: the torch tests, kept pending and summed at the report)
FAMILIES = kernels.KERNELS if kernels.numba_available() else ("numpy",)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("limit", [1 << 24, 5])
def test_counts_summed_late_equal_each_calls_own(
    limit: int, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Router calls keep their row tests unsummed (or count them on the host); the counts read
    at the report (or summed early once too many rows wait) are each call's own counts added
    up, empty calls too."""
    monkeypatch.setattr(tally, "MAX_PENDING_ROWS", limit)
    monkeypatch.setattr(kernels, "_CHOSEN", [family])
    g = torch.Generator().manual_seed(0)
    controller = ReplayController(num_experts=8, top_k=2)
    routers = [ScoreRouter(1), ScoreRouter(2)]
    controller.attach(nn.ModuleList(routers), walk=lambda m: [(r.layer_number, r) for r in m])
    controller.set_mode(ReplayMode.REPLAY)
    want = {1: [0, 0, 0], 2: [0, 0, 0]}  # set hits, order hits, rows
    for mb, rows in enumerate([4, 0, 7, 3]):
        scores = torch.rand(rows, 8, generator=g)
        targets = (
            torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(rows)])
            if rows
            else torch.zeros(0, 2, dtype=torch.int64)
        )
        routes = RouteBatch(
            torch.stack([targets, targets], dim=1).to(torch.int16),
            torch.tensor([0, rows]),
            torch.ones(rows, dtype=torch.bool),
            RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2)),
        )
        controller.arm_batch(mb, routes)
        with controller.microbatch(mb):
            for r in routers:
                r(scores, 2)
        agree, order = topk_set_and_order_T(scores, targets)
        for layer in (1, 2):
            want[layer][0] += int(agree.sum())
            want[layer][1] += int((agree & order).sum())
            want[layer][2] += rows
    report_ = controller.end_step()
    controller.detach()
    assert report_.agreement == {k: v[0] / v[2] for k, v in want.items()}
    assert report_.order_agreement == {k: v[1] / v[2] for k, v in want.items()}


@settings(max_examples=60, deadline=None)
@given(
    call=router_calls(rows=(0, 24), experts=(2, 10)),
    dtype=SCORE_DTYPES,
    by_rows=st.booleans(),
    masked=st.booleans(),
)
def test_host_counts_and_device_tests_report_the_same(
    call: RouterCall, dtype: torch.dtype, by_rows: bool, masked: bool
) -> None:
    """The step report is the same whichever way the calls counted: on the host in the
    compiled pass (CPU float scores under numba) or as pending torch tests summed at the end;
    ties, unordered slots, masks, a row index and several calls per router included."""
    rows, experts, k, seed = call
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor([0.0, 0.25, 0.5, 1.0, -1.0], dtype=dtype)  # ties are common
    scores = [values[torch.randint(5, (rows, experts), generator=g)] for _ in range(2)]
    targets = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(rows + 1)])
    rows_T = torch.randint(rows + 1, (rows,), generator=g) if by_rows else None
    mask = torch.rand(rows, generator=g) < 0.7 if masked else None
    reports = []
    for family in FAMILIES:
        router = ScoreRouter(1)
        ctrl = ReplayController(num_experts=experts, top_k=k)
        ctrl.attach(nn.ModuleList([router]))
        ctrl.set_mode(ReplayMode.REPLAY)
        routes = (targets if rows_T is not None else targets[:rows])[:, None].to(torch.uint8)
        with kernels.use_kernel(family):
            ctrl.arm(0, routes, layer_numbers=[1], replay_mask_T=mask, rows_T=rows_T)
            for scores_TE in scores:  # two forwards of one micro-batch
                router(scores_TE, k)
            got = ctrl.end_step()
        ctrl.detach()
        reports.append((got.agreement, got.order_agreement))
    assert all(r == reports[0] for r in reports)
    replayed = rows if mask is None else int(mask.sum())
    assert set(reports[0][0]) == ({1} if replayed else set())
