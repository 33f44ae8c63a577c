"""Property sweep of the replay path (top-k, ReplayController, a replayed forward) and of
failure_mode: a checked result or an RRError.

The invariant every sweep checks, and the list of swept names: test_core_sweep.py; the generated
input: rr_core_testing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rr_core
from rr_core import ReplayController, ReplayMode, RRError
from rr_fakes.pytest_support import settles

from rr_core_testing import (
    ANY_DTYPES,
    ANYTHING,
    INT_DTYPES,
    JUNK,
    SWEEP,
    TinyModel,
    tensors,
    valid_batches,
)


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
