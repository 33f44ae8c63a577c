"""arm(rows_T=...): source rows armed through a row index replay what the same rows laid out
in the router's order replay, and a bad index is refused with what it spans."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode
from rr_fakes import distinct_ids

from rr_core_testing import E, H, K, TinyModel


def armed_run(model: nn.Module, x: torch.Tensor, **arm: Any) -> torch.Tensor:
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        layers = ctrl.attach(model)
        ctrl.set_mode(ReplayMode.REPLAY)
        ctrl.arm(0, layer_numbers=layers, **arm)
        out = model(x)
        out.sum().backward()
        ctrl.end_step()
        return model.routed_ids()  # type: ignore[no-any-return, operator]
    finally:
        ctrl.detach()


@pytest.mark.parametrize("recompute", [None, "non_reentrant"])
def test_a_row_index_replays_what_the_laid_out_rows_replay(recompute: str | None) -> None:
    model = TinyModel(num_layers=3, recompute=recompute, seed=5)
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(6))
    source = distinct_ids(4, 3, num_experts=E, top_k=K, seed=7, dtype=torch.uint8)
    rows = torch.tensor([2, 0, 0, 1, 3, 0, 2])
    mask = torch.tensor([True, False, True, True, True, False, True])
    laid = armed_run(model, x, routes_TLK=source[rows], replay_mask_T=mask)
    indexed = armed_run(model, x, routes_TLK=source, replay_mask_T=mask, rows_T=rows)
    assert torch.equal(indexed, laid)
    assert torch.equal(indexed[mask], source[rows][mask].long())


def test_validation_checks_the_rows_the_index_replays() -> None:
    model = TinyModel(num_layers=3, seed=5)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        layers = ctrl.attach(model)
        source = distinct_ids(3, 3, num_experts=E, top_k=K, seed=8, dtype=torch.uint8)
        source[2, 1, 0] = E  # out of range, in a row only a native row points at
        rows, mask = torch.tensor([0, 1, 2]), torch.tensor([True, True, False])
        ctrl.arm(0, source, layer_numbers=layers, replay_mask_T=mask, rows_T=rows)
        ctrl.release(0)
        with pytest.raises(ReplayError, match=f"layer {layers[1]}"):
            ctrl.arm(0, source, layer_numbers=layers, rows_T=rows)
    finally:
        ctrl.detach()


@pytest.mark.parametrize(
    ("rows", "mask", "message"),
    [
        ([0, 1], None, "rows_T must be an int64 .T. tensor.*got list"),
        (torch.tensor([0, 1], dtype=torch.int32), None, "got torch.int32 .2."),
        (torch.tensor([[0, 1]]), None, r"got torch.int64 \[1, 2\]"),
        (torch.tensor([0, 3]), None, r"rows_T spans \[0, 3\], outside the 3 armed rows"),
        (torch.tensor([-1, 0]), None, r"rows_T spans \[-1, 0\]"),
        (torch.tensor([0, 1]), torch.ones(3, dtype=torch.bool), r"replay mask must be bool \[2\]"),
    ],
)
def test_a_bad_row_index_is_refused(rows: Any, mask: Any, message: str) -> None:
    model = TinyModel(num_layers=2, seed=5)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        layers = ctrl.attach(model)
        source = distinct_ids(3, 2, num_experts=E, top_k=K, seed=9, dtype=torch.uint8)
        with pytest.raises(ReplayError, match=message):
            ctrl.arm(0, source, layer_numbers=layers, replay_mask_T=mask, rows_T=rows)
    finally:
        ctrl.detach()
