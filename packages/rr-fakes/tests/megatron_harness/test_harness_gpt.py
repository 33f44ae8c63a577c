"""Tiny real GPTModel MoE models on CPU: forward, backward, and where the routers are."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rr_core import walk_routers
from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, gpt_inputs, model_parallel, train_step


def routers_by_layer(model: nn.Module) -> list[int]:
    return [layer for layer, _ in walk_routers(model)]


def mtp_routers(model: nn.Module) -> list[nn.Module]:
    return [
        m for name, m in model.named_modules() if name.startswith("mtp") and name.endswith("router")
    ]


@pytest.mark.parametrize(
    ("kw", "layers"),
    [
        ({}, [1, 2, 3, 4]),
        ({"dispatcher": "allgather", "aux_loss_coeff": 0.01}, [1, 2, 3, 4]),
        ({"score_function": "sigmoid", "expert_bias": True}, [1, 2, 3, 4]),
        ({"moe_layer_freq": [0, 1, 1, 1]}, [2, 3, 4]),  # dense first (A2)
        ({"moe_layer_freq": 2, "num_layers": 6}, [1, 3, 5]),
    ],
)
def test_forward_backward_and_router_layers(kw: dict[str, Any], layers: list[int]) -> None:
    with model_parallel():
        model = build_gpt(TinyGPTConfig(**kw))
        assert routers_by_layer(model) == layers
        losses = train_step([model], [gpt_inputs(2, 8, 64), gpt_inputs(2, 8, 64, seed=1)])
        assert len(losses) == 2
        assert all(torch.isfinite(torch.tensor(losses)))
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert grads
        assert all(g is not None for g in grads)
        routers = [router for _, router in walk_routers(model)]
        assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)


def test_same_seed_gives_the_same_loss() -> None:
    losses = []
    for _ in range(2):
        with model_parallel(seed=5):
            model = build_gpt(TinyGPTConfig())
            losses.append(train_step([model], [gpt_inputs(1, 8, 64)], forward_only=True))
    assert losses[0] == losses[1]


def test_A4_mtp_builds_and_trains_on_cpu_and_its_routers_are_not_on_the_decoder_axis() -> None:
    with model_parallel() as flags:
        model = build_gpt(TinyGPTConfig(mtp_num_layers=1))
        assert routers_by_layer(model) == [1, 2, 3, 4]
        mtp = mtp_routers(model)
        assert len(mtp) == 1
        if flags.router_has_is_mtp_layer:
            assert mtp[0].is_mtp_layer is True
        train_step([model], [gpt_inputs(2, 8, 64)])
        assert mtp[0].weight.grad is not None


def _recompute_grads(recompute: bool) -> dict[str, torch.Tensor]:
    extra: dict[str, Any] = {"hidden_dropout": 0.1}
    if recompute:
        extra.update(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    with model_parallel(seed=5):
        model = build_gpt(TinyGPTConfig(extra=extra))
        train_step([model], [gpt_inputs(2, 8, 64)])
        return {
            name: p.main_grad if getattr(p, "main_grad", None) is not None else p.grad
            for name, p in model.named_parameters()
            if p.grad is not None
        }


def test_megatron_activation_recompute_runs_on_cpu_and_matches_plain_backward() -> None:
    """Megatron's own ``recompute_granularity="full"`` saves and restores generator state around
    the recompute; with dropout on, the recomputed forward must draw the same masks, so the
    gradients equal those of a run without recompute."""
    plain, recomputed = _recompute_grads(False), _recompute_grads(True)
    assert plain.keys() == recomputed.keys()
    assert plain
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, msg=name)
