"""One replaying router call: the controller's checked-once path gives what the plain
algorithm gives (ids, values, gradients), runs few ops, and its mode lookup follows the
controller's state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from rr_core import (
    ReplayController,
    ReplayError,
    ReplayMode,
    RouteBatch,
    RouteMeta,
    RRWarning,
    kernels,
    replay_topk,
)
from rr_core.records.shards import concat_batches
from rr_core.replay.controller import replayed_unchecked_ids
from rr_fakes import distinct_ids

from rr_core_testing import RouterCall, router_calls

ID_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


def _reference(
    scores_TE: torch.Tensor,
    k: int,
    targets_TK: torch.Tensor,
    mask_T: torch.Tensor | None,
    values_TE: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The algorithm spelled out: armed ids on masked rows, a full native top-k elsewhere,
    values gathered from the (value) scores."""
    with torch.no_grad():
        ids_TK = targets_TK.to(torch.int64).clone()
        if mask_T is not None:
            native_TK = torch.topk(scores_TE, k, dim=-1).indices
            ids_TK[~mask_T] = native_TK[~mask_T]
    source_TE = scores_TE if values_TE is None else values_TE
    return source_TE.gather(-1, ids_TK), ids_TK


def _controller(
    e: int, k: int, agreement: bool | str = False
) -> tuple[ReplayController, nn.Module]:
    routers = [nn.Linear(1, 1), nn.Linear(1, 1)]
    controller = ReplayController(num_experts=e, top_k=k, measure_agreement=agreement)
    controller.attach(routers, walk=lambda _: [(1, routers[0]), (2, routers[1])])
    controller.set_mode(ReplayMode.REPLAY)
    return controller, routers[1]


@settings(max_examples=60, deadline=None)
@given(call=router_calls(rows=(1, 40), experts=(2, 32)), data=st.data())
def test_a_replaying_call_matches_the_plain_algorithm_bit_for_bit(
    call: RouterCall, data: st.DataObject
) -> None:
    t, e, k, seed = call
    dtype = data.draw(st.sampled_from(ID_DTYPES))
    masking = data.draw(st.sampled_from(["none", "random", "all", "nothing"]))
    biased = data.draw(st.booleans())
    by_rows = data.draw(st.booleans())
    agreement = data.draw(st.sampled_from([False, True, "exact"]))
    g = torch.Generator().manual_seed(seed)
    routes_TLK = distinct_ids(t, 2, num_experts=e, top_k=k, seed=seed).to(dtype)
    before = routes_TLK.clone()
    mask_T = {
        "none": None,
        "random": torch.rand(t, generator=g) < 0.7,
        "all": torch.ones(t, dtype=torch.bool),
        "nothing": torch.zeros(t, dtype=torch.bool),
    }[masking]
    rows_T = torch.randperm(t, generator=g) if by_rows else None
    logits = torch.randn(t, e, generator=g, requires_grad=True)
    scores_TE = torch.softmax(logits, dim=-1)
    values_TE = scores_TE * 0.5 if biased else None

    controller, router = _controller(e, k, agreement)
    try:
        controller.arm(0, routes_TLK, layer_numbers=(1, 2), replay_mask_T=mask_T, rows_T=rows_T)
        out = controller.route(router, scores_TE, k, values_TE=values_TE)
    finally:
        controller.detach()
    targets_TK = routes_TLK[:, 1] if rows_T is None else routes_TLK[rows_T, 1]
    values_TK, ids_TK = _reference(scores_TE, k, targets_TK, mask_T, values_TE)
    assert out.ids_TK.dtype == torch.int64
    assert torch.equal(out.ids_TK, ids_TK)
    assert torch.equal(out.values_TK, values_TK)
    assert torch.equal(routes_TLK, before)  # armed routes are never written
    weights_TK = torch.rand(t, k, generator=g)
    (grad,) = torch.autograd.grad((out.values_TK * weights_TK).sum(), logits, retain_graph=True)
    (expected,) = torch.autograd.grad((values_TK * weights_TK).sum(), logits)
    assert torch.equal(grad, expected)


@settings(max_examples=40, deadline=None)
@given(call=router_calls(rows=(1, 24), experts=(2, 16)), data=st.data())
def test_replay_topk_matches_the_plain_algorithm(call: RouterCall, data: st.DataObject) -> None:
    t, e, k, seed = call
    g = torch.Generator().manual_seed(seed)
    scores_TE = torch.softmax(torch.randn(t, e, generator=g, requires_grad=True), dim=-1)
    targets_TK = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
    targets_TK = targets_TK.to(data.draw(st.sampled_from(ID_DTYPES)))
    before = targets_TK.clone()
    mask_T = data.draw(st.sampled_from([None, torch.rand(t, generator=g) < 0.5]))
    out = replay_topk(scores_TE, k, target_ids_TK=targets_TK, replay_mask_T=mask_T)
    values_TK, ids_TK = _reference(scores_TE, k, targets_TK, mask_T, None)
    assert torch.equal(out.ids_TK, ids_TK)
    assert torch.equal(out.values_TK, values_TK)
    assert torch.equal(targets_TK, before)


class _Ops(TorchDispatchMode):
    """The aten ops run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kernel", ["numba", "numpy"])
def test_a_replaying_call_runs_only_the_ops_of_the_route(masked: bool, kernel: str) -> None:
    # checks happen at arming; per call (after the micro-batch's first) on the torch path: the
    # layer's ids, widened, R3's native rows (a top-k of those rows only, merged in one
    # index_copy_) and one gather; where the compiled pass runs, the scores read on the host
    # (two views), the ids it wrote and the gather, the agreement counted there too. No
    # nonzero: no host sync
    if kernel == "numba" and not kernels.numba_available():
        pytest.skip("numba is not installed")
    agreement = kernel == "numba"
    controller, router = _controller(8, 2, agreement)
    try:
        routes_TLK = distinct_ids(16, 2, num_experts=8, top_k=2, seed=0, dtype=torch.uint8)
        mask_T = torch.ones(16, dtype=torch.bool)
        mask_T[-2:] = False
        controller.arm(
            0, routes_TLK, layer_numbers=(1, 2), replay_mask_T=mask_T if masked else None
        )
        scores_TE = torch.softmax(torch.randn(16, 8, requires_grad=True), dim=-1)
        with kernels.use_kernel(kernel):
            controller.route(router, scores_TE, 2)  # the first reads the armed ids once
            with _Ops() as seen:
                controller.route(router, scores_TE, 2)
        assert set(controller.agreement()) == ({2} if agreement else set())
    finally:
        controller.detach()
    if kernel == "numba":
        assert seen.ops == ["detach", "detach", "lift_fresh", "gather"]
        return
    native = ["detach", "index_select", "topk", "index_copy_"] if masked else []
    assert seen.ops == ["select", "_to_copy", *native, "gather"]


def test_scores_that_rank_nothing_still_fail_with_their_dtype() -> None:
    controller, router = _controller(4, 2)
    try:
        controller.arm(0, distinct_ids(3, 2, num_experts=4, top_k=2, seed=1), layer_numbers=(1, 2))
        with pytest.raises(
            ReplayError, match=r"scores_TE must hold real scores; got dtype torch.bool"
        ):
            controller.route(router, torch.zeros(3, 4, dtype=torch.bool), 2)
        with pytest.raises(ReplayError, match=r"controller expects \[T, 4\] and k=2"):
            controller.route(router, torch.rand(3, 5), 2)
    finally:
        controller.detach()


def test_mode_of_follows_set_mode_attach_and_detach() -> None:
    routers = [nn.Linear(1, 1) for _ in range(3)]
    controller = ReplayController(num_experts=4, top_k=2)
    controller.attach(routers, walk=lambda _: [(2, routers[0]), (5, routers[1])])
    assert controller.mode_of(2) is ReplayMode.OFF
    controller.set_mode(ReplayMode.REPLAY, layers=[5])
    assert controller.mode_of(5) is ReplayMode.REPLAY
    assert controller.mode_of(np.int64(5)) is ReplayMode.REPLAY  # a numpy int: the checked way
    assert controller.mode_of(2) is ReplayMode.OFF
    with pytest.raises(ReplayError, match=r"layers \[3\] have no attached router; have \(2, 5\)"):
        controller.mode_of(3)
    with pytest.raises(ReplayError, match=r"1-based integer layer numbers; got \[True\]"):
        controller.mode_of(True)  # True == 1 as a dict key: never taken for layer 1
    controller.attach(routers, walk=lambda _: [(1, routers[2])])
    assert controller.mode_of(1) is ReplayMode.OFF
    with pytest.raises(ReplayError, match=r"layers \[5\] have no attached router; have \(1,\)"):
        controller.mode_of(5)
    controller.detach()
    with pytest.raises(ReplayError, match=r"layers \[1\] have no attached router; have \(\)"):
        controller.mode_of(1)


@pytest.mark.parametrize("validate", [True, False])
def test_the_latest_call_tells_whether_its_ids_were_checked(validate: bool) -> None:
    controller, router = _controller(4, 2)
    try:
        routes_TLK = distinct_ids(3, 2, num_experts=4, top_k=2, seed=2)
        controller.arm(0, routes_TLK, layer_numbers=(1, 2), validate=validate)
        controller.route(router, torch.rand(3, 4), 2)
        assert replayed_unchecked_ids() is not validate
    finally:
        controller.detach()
    lenient, router = _controller(4, 2)
    lenient.strict = False
    try:
        with pytest.warns(RRWarning, match="nothing is armed"):
            lenient.route(router, torch.rand(3, 4), 2)  # native: nothing unchecked replayed
        assert not replayed_unchecked_ids()
    finally:
        lenient.detach()


@pytest.mark.parametrize("checked", ["built", "validated later", "derived", "unchecked"])
def test_a_route_batch_arms_as_checked_as_its_ids_were(checked: str) -> None:
    """arm_batch does not check the ids again: a batch that checked them (built with
    validate=True, validate() called, or derived from such a batch) arms them as checked; one
    built with validate=False arms them unchecked, so adapters count its rows."""
    meta = RouteMeta(num_experts=4, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2))
    routes_TLK = distinct_ids(3, 2, num_experts=4, top_k=2, seed=2)
    batch = RouteBatch(routes_TLK, [0, 3], None, meta, validate=checked != "unchecked")
    if checked == "validated later":
        batch = RouteBatch(routes_TLK, [0, 3], None, meta, validate=False)
        batch.validate()
    elif checked == "derived":
        batch = concat_batches([batch.to("cpu"), batch])
    assert batch.ids_validated is (checked != "unchecked")
    for arm in ("arm_batch", "arm"):
        controller, router = _controller(4, 2)
        try:
            if arm == "arm_batch":
                controller.arm_batch(0, batch)
            else:  # as rr_transformers.arm_routes arms a batch through its row index
                controller.arm(
                    0,
                    batch.values_NLK,
                    layer_numbers=(1, 2),
                    replay_mask_T=batch.valid_N,
                    validate=False,
                    ids_validated=batch.ids_validated,
                )
            controller.route(router, torch.rand(batch.num_tokens, 4), 2)
            assert replayed_unchecked_ids() is (checked == "unchecked"), arm
        finally:
            controller.detach()


@pytest.mark.skipif(not kernels.numba_available(), reason="numba is not installed")
@settings(max_examples=60, deadline=None)
@given(call=router_calls(rows=(1, 12), experts=(2, 12)))
def test_the_compiled_pass_ranks_native_rows_as_topk_with_ties_to_the_lower_id(
    call: RouterCall,
) -> None:
    # scores of few distinct values (ties everywhere), NaN among them: torch.topk's values,
    # NaN first; among equal scores the lower expert id first (torch leaves that order open)
    t, e, k, seed = call
    g = torch.Generator().manual_seed(seed)
    scores_TE = torch.randint(0, 3, (t, e), generator=g).float()
    scores_TE[torch.rand(t, e, generator=g) < 0.1] = float("nan")
    mask_T = torch.rand(t, generator=g) < 0.5
    routes_TLK = distinct_ids(t, 2, num_experts=e, top_k=k, seed=0).to(torch.uint8)
    controller, router = _controller(e, k, agreement=True)
    try:
        controller.arm(0, routes_TLK, layer_numbers=(1, 2), replay_mask_T=mask_T)
        with kernels.use_kernel("numba"):
            out = controller.route(router, scores_TE, k)
    finally:
        controller.detach()
    key_TE = torch.where(scores_TE.isnan(), float("inf"), scores_TE)
    order_TE = torch.from_numpy(np.lexsort((np.arange(e)[None].repeat(t, 0), -key_TE.numpy())))
    want_TK = torch.where(mask_T[:, None], routes_TLK[:, 1].long(), order_TE[:, :k])
    assert torch.equal(out.ids_TK, want_TK)
    native_values = torch.topk(scores_TE, k, dim=-1).values
    assert torch.allclose(
        out.values_TK[~mask_T], native_values[~mask_T], rtol=0, atol=0, equal_nan=True
    )
