"""RECORD under non-reentrant activation checkpointing: the forward and its recompute must save
the same tensors (torch checks, and raises CheckpointError when they differ: the "75 vs 70
tensors" failure of replay with FSDP2 checkpointing), and route alike."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rr_core import ReplayController, ReplayMode, router_topk

E, K, H = 8, 2, 16


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H))

    def forward(self, x_TH: torch.Tensor):
        return router_topk(self, torch.softmax(x_TH @ self.weight.t(), dim=-1), K)


class Layer(nn.Module):
    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.router = Router()
        self.experts = nn.Parameter(torch.randn(E, H, H) * 0.1)

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        probs_TK, ids_TK = self.router(x_TH)
        out_TKH = torch.einsum("th,tkhg->tkg", x_TH, self.experts[ids_TK])
        return x_TH + (probs_TK.unsqueeze(-1) * out_TKH).sum(1)


class Model(nn.Module):
    def __init__(self, recompute: bool) -> None:
        super().__init__()
        self.decoder = nn.ModuleList(Layer(i + 1) for i in range(2))
        self.recompute = recompute

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        for layer in self.decoder:
            x_TH = checkpoint(layer, x_TH, use_reentrant=False) if self.recompute else layer(x_TH)
        return x_TH


def _record_step(recompute: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = Model(recompute)
    controller = ReplayController(num_experts=E, top_k=K)
    controller.attach(model)
    try:
        controller.set_mode(ReplayMode.RECORD)
        x_TH = torch.randn(6, H)
        with controller.microbatch(0) as mb:
            out = model(x_TH)
            mb.track(out)
        out.square().mean().backward()  # the recompute runs here, inside the backward
        recorded = controller.recorded(0)
        controller.end_step()
    finally:
        controller.detach()
    return recorded, [p.grad for p in model.parameters()]


def test_record_with_non_reentrant_recompute_saves_what_the_forward_saved() -> None:
    recorded, grads = _record_step(recompute=True)  # raised CheckpointError before
    plain_recorded, plain_grads = _record_step(recompute=False)
    assert torch.equal(recorded, plain_recorded)
    for got, expected in zip(grads, plain_grads, strict=True):
        assert got is not None
        assert expected is not None
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
