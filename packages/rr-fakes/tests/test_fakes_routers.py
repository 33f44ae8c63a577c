"""FakeTopKRouter and FakeHashGate: Megatron's routing semantics and the replay hook point."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rr_core import ReplayController, ReplayMode, walk_routers
from rr_fakes._routers import FakeHashGate, FakeTopKRouter, group_limited_mask_NE, token_hash_NK

H, E, K = 8, 8, 2


def hidden(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed))


def router(**kw: object) -> FakeTopKRouter:
    args: dict[str, object] = {"layer_number": 1, "generator": torch.Generator().manual_seed(3)}
    args.update(kw)
    return FakeTopKRouter(H, E, K, **args)  # type: ignore[arg-type]


class Holder(nn.Module):
    """A decoder layer holding one router, so the walk and the controller can find it."""

    def __init__(self, r: FakeTopKRouter) -> None:
        super().__init__()
        self.router = r


def test_softmax_router_takes_top_k_of_softmax_scores() -> None:
    r = router()
    x = hidden(5)
    probs, ids = r(x)
    scores = torch.softmax(x @ r.weight.t(), dim=-1)
    expected = scores.topk(K, dim=-1)
    assert torch.equal(ids, expected.indices)
    assert torch.allclose(probs, expected.values)
    assert r.calls == 1
    assert r.last_ids_NK is not None
    assert torch.equal(r.last_ids_NK, ids)


def test_softmax_after_top_k_normalises_the_kept_logits() -> None:
    r = router(pre_softmax=False)
    x = hidden(5)
    probs, ids = r(x)
    logits = x @ r.weight.t()
    assert torch.equal(ids, logits.topk(K, dim=-1).indices)
    assert torch.allclose(probs.sum(-1), torch.ones(5))


def test_sigmoid_router_renormalises_over_the_chosen_experts() -> None:
    r = router(score_function="sigmoid")
    x = hidden(6)
    probs, ids = r(x)
    scores = torch.sigmoid(x @ r.weight.t())
    assert torch.equal(ids, scores.topk(K, dim=-1).indices)
    assert torch.allclose(probs.sum(-1), torch.ones(6))


def test_expert_bias_steers_selection_but_not_weights() -> None:
    r = router(score_function="sigmoid", expert_bias=True)
    assert r.expert_bias is not None
    r.expert_bias[5] = 10.0  # every token now picks expert 5
    x = hidden(7)
    probs, ids = r(x)
    assert (ids == 5).any(dim=-1).all()
    scores = torch.sigmoid(x @ r.weight.t())
    picked = scores.gather(-1, ids)
    assert torch.allclose(probs, picked / picked.sum(-1, keepdim=True))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), groups=st.sampled_from([(2, 1), (4, 2), (4, 1)]))
def test_group_limited_top_k_stays_inside_the_best_groups(
    seed: int, groups: tuple[int, int]
) -> None:
    num_groups, group_topk = groups
    r = router(num_groups=num_groups, group_topk=group_topk, score_function="sigmoid")
    x = hidden(9, seed)
    _, ids = r(x)
    scores = torch.sigmoid(x @ r.weight.t())
    mask = group_limited_mask_NE(scores, top_k=K, num_groups=num_groups, group_topk=group_topk)
    assert mask.gather(-1, ids).all()
    group_of_ids = ids // (E // num_groups)
    assert all(len(set(row.tolist())) <= group_topk for row in group_of_ids)
    assert torch.equal(ids, scores.masked_fill(~mask, float("-inf")).topk(K, dim=-1).indices)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"layer_number": 0}, "1-based"),
        ({"score_function": "relu"}, "score_function"),
        ({"num_groups": 3, "group_topk": 1}, "group-limited"),
        ({"num_groups": 2}, "both"),
    ],
)
def test_bad_router_arguments_raise(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        router(**kw)


def test_routers_announce_themselves_to_a_registry() -> None:
    registry: list[nn.Module] = []
    first, second = router(registry=registry), router(registry=registry, layer_number=2)
    assert registry == [first, second]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"score_function": "sigmoid", "expert_bias": True},
        {"num_groups": 4, "group_topk": 2, "score_function": "sigmoid"},
    ],
)
def test_the_router_goes_through_the_replay_hook(kw: dict[str, object]) -> None:
    """Record gives the native ids; replay forces other ids and takes their weights from the
    unbiased, unmasked scores, so gradients reach experts the native top-k would not pick."""
    r = router(**kw)
    if r.expert_bias is not None:
        r.expert_bias[0] = 1.0
    holder = Holder(r)
    x = hidden(4)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        assert ctrl.attach(holder) == (1,)
        ctrl.set_mode(ReplayMode.RECORD)
        _, native = r(x)
        assert torch.equal(ctrl.recorded()[:, 0], native)
        ctrl.end_step()

        target = (native + 3) % E  # distinct per row, differs from native
        ctrl.set_mode(ReplayMode.REPLAY)
        ctrl.arm(0, target.unsqueeze(1), layer_numbers=[1])
        probs, ids = r(x)
        assert torch.equal(ids, target)
        probs.sum().backward()
        assert r.weight.grad is not None
        assert r.weight.grad.abs().sum() > 0
        ctrl.end_step()
    finally:
        ctrl.detach()


def test_hash_gate_is_a_fixed_function_of_the_token_and_not_a_router() -> None:
    gate = FakeHashGate(H, E, K, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([3, 7, 3, 11])
    _, ids_a = gate(hidden(4, 1), tokens)
    _, ids_b = gate(hidden(4, 2), tokens)
    assert torch.equal(ids_a, ids_b)
    assert torch.equal(ids_a[0], ids_a[2])
    assert all(len(set(row.tolist())) == K for row in ids_a)
    assert torch.equal(ids_a, token_hash_NK(tokens, E, K))
    assert walk_routers(nn.ModuleList([gate])) == []
