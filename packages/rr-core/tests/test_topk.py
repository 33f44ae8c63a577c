"""replay_topk on its own: exact ids, values from the router's scores, gradients (B4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from rr_core import ReplayError, native_topk, replay_topk
from rr_core.replay.topk import same_sets_T

from rr_core_testing import RouterCall, router_calls


@settings(max_examples=60, deadline=None)
@given(call=router_calls(rows=(1, 32), experts=(2, 64)))
def test_replay_yields_exactly_the_targets_with_values_from_the_scores(call: RouterCall) -> None:
    t, e, k, seed = call
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g, requires_grad=True)
    scores = torch.softmax(logits, dim=-1)
    targets = (
        torch.rand(t, e, generator=g)
        .topk(k, dim=-1)
        .indices.to(torch.uint8 if e <= 256 else torch.int16)
    )
    mask = torch.rand(t, generator=g) < 0.7
    native = native_topk(scores, k)
    rows = (~mask).nonzero().flatten()  # the native top-k only on the rows outside the mask
    for out in (
        replay_topk(scores, k, target_ids_TK=targets, replay_mask_T=mask),
        replay_topk(scores, k, target_ids_TK=targets, replay_mask_T=mask, native_rows_N=rows),
        replay_topk(
            scores, k, target_ids_TK=targets, replay_mask_T=mask, native_ids_TK=native.ids_TK
        ),
    ):
        assert torch.equal(out.ids_TK[mask], targets[mask].long())
        assert torch.equal(out.ids_TK[~mask], native.ids_TK[~mask])
        assert torch.equal(out.values_TK, scores.gather(1, out.ids_TK))
        out.values_TK.sum().backward(retain_graph=True)
        assert logits.grad is not None


def test_masked_replay_never_writes_the_callers_targets() -> None:
    # int64 targets on the scores' device are used as they are: the native rows must go to a
    # copy, or the armed routes would carry native ids into the next call
    scores = torch.softmax(torch.randn(6, 8, generator=torch.Generator().manual_seed(3)), -1)
    targets = torch.tensor([[7, 6]] * 6)
    before = targets.clone()
    mask = torch.tensor([True, True, False, True, True, False])
    out = replay_topk(scores, 2, target_ids_TK=targets, replay_mask_T=mask)
    assert torch.equal(targets, before)
    assert torch.equal(out.ids_TK[~mask], scores.topk(2).indices[~mask])


def test_B4_gradient_reaches_replayed_experts_the_native_router_did_not_pick() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]], requires_grad=True)
    scores = torch.softmax(logits, dim=-1)
    scores.retain_grad()
    out = replay_topk(scores, 2, target_ids_TK=torch.tensor([[2, 3]]))
    out.values_TK.sum().backward()
    assert bool((scores.grad[0, [2, 3]] != 0).all())
    # Gathering from top-k-masked scores (the field bug) would give zeros at 2 and 3.
    masked = torch.zeros_like(scores).scatter(1, native_topk(scores, 2).ids_TK, scores)
    assert bool((masked.gather(1, torch.tensor([[2, 3]])) == 0).all())


def test_values_from_unbiased_scores_when_selection_is_biased() -> None:
    scores = torch.tensor([[0.1, 0.5, 0.4]])
    biased = scores + torch.tensor([1.0, 0.0, 0.0])
    native = native_topk(biased, 1, values_TE=scores)
    assert native.ids_TK.tolist() == [[0]]
    assert torch.equal(native.values_TK, scores[:, [0]])
    replayed = replay_topk(biased, 1, target_ids_TK=torch.tensor([[2]]), values_TE=scores)
    assert torch.equal(replayed.values_TK, scores[:, [2]])


def test_same_sets_ignores_order() -> None:
    a = torch.tensor([[1, 2, 3], [1, 2, 3]])
    b = torch.tensor([[3, 1, 2], [1, 2, 4]], dtype=torch.uint8)
    assert same_sets_T(a, b).tolist() == [True, False]


@pytest.mark.parametrize(
    ("scores", "k", "message"),
    [
        (None, 2, r"scores_TE must be a \[\.\.\., E\] tensor; got NoneType"),
        ([[0.1, 0.9]], 1, "got list"),
        (torch.tensor(0.5), 1, r"got torch.Size\(\[\]\)"),
        (torch.rand(3, 4), 5, r"k must be in \[1, E=4\]; got 5"),
        (torch.rand(3, 4), 0, r"k must be in \[1, E=4\]"),
        (torch.rand(3, 4), 2.0, "k must be an int"),
        (torch.rand(3, 4), True, "k must be an int"),
    ],
)
def test_native_topk_refuses_bad_calls(scores: Any, k: Any, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        native_topk(scores, k)


def test_native_topk_takes_any_leading_shape() -> None:
    scores = torch.rand(2, 3, 5)
    assert native_topk(scores, 2).ids_TK.shape == (2, 3, 2)


@pytest.mark.parametrize(
    "ids", [torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool), [[0, 1]] * 3, np.zeros((3, 2))]
)
def test_replay_topk_refuses_targets_that_are_not_integer_tensors(ids: Any) -> None:
    with pytest.raises(ReplayError, match=r"target_ids_TK must be an integer tensor \[T, 2\]"):
        replay_topk(torch.rand(3, 4), 2, target_ids_TK=ids)
    with pytest.raises(ReplayError, match=r"scores_TE must be a \[T, E\] tensor"):
        replay_topk(torch.rand(2, 3, 4), 2, target_ids_TK=torch.zeros(3, 2, dtype=torch.long))
