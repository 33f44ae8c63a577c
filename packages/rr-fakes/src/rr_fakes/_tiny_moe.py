"""A tiny causal MoE language model for rollout emulation, torch only.

How it differs from :mod:`rr_fakes._models` (``FakeMoEModel``, the Megatron-shaped stack for
layout and replay tests): tokens mix causally here, so a route depends on the prefix and the
emulator's prefill and decode steps route like an engine's; there are no pipeline chunks, hash
or MTP layers. Its :class:`TinyRouter` is a plain softmax router, not :class:`FakeTopKRouter`.

It has the shape replay code looks for: ``model.decoder.layers[i]`` with a global 1-based
``layer_number``, and on MoE layers a ``router`` (class name ending in ``Router``) whose top-k
step goes through :func:`rr_core.router_topk`. Token mixing is a causal running mean, so the
route of position t depends only on tokens up to t, as in a decoder with causal attention.

Shapes: B batch, S sequence, T tokens (B*S), H hidden, E experts, K top-k, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import rr_core


class TinyRouter(nn.Module):
    """Softmax top-k gating; the top-k step is rr_core's hook point."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, layer_number: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, hidden_size) / hidden_size**0.5)
        self.topk, self.layer_number = top_k, layer_number

    def forward(self, hidden_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores_TE = torch.softmax(hidden_TH @ self.weight.t(), dim=-1)
        out = rr_core.router_topk(self, scores_TE, self.topk)
        return out.values_TK, out.ids_TK


class TinyMoE(nn.Module):
    """Experts are small linear maps; each token's output is the weighted sum of its K."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, layer_number: int) -> None:
        super().__init__()
        self.router = TinyRouter(hidden_size, num_experts, top_k, layer_number)
        self.experts = nn.ModuleList(
            nn.Linear(hidden_size, hidden_size) for _ in range(num_experts)
        )

    def forward(self, hidden_TH: torch.Tensor) -> torch.Tensor:
        probs_TK, ids_TK = self.router(hidden_TH)
        out_TH = torch.zeros_like(hidden_TH)
        for e, expert in enumerate(self.experts):
            hit_TK = ids_TK == e
            rows = hit_TK.any(-1).nonzero().squeeze(-1)
            if rows.numel():
                weight_T1 = (probs_TK * hit_TK)[rows].sum(-1, keepdim=True)
                out_TH[rows] += weight_T1 * expert(hidden_TH[rows])
        return out_TH


class TinyLayer(nn.Module):
    """Causal running-mean mixing, then an MoE or a dense MLP."""

    def __init__(self, hidden_size: int, layer_number: int, mlp: nn.Module) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.mix = nn.Linear(hidden_size, hidden_size)
        self.mlp = mlp

    def forward(self, hidden_BSH: torch.Tensor) -> torch.Tensor:
        steps_1S1 = torch.arange(1, hidden_BSH.shape[1] + 1, dtype=hidden_BSH.dtype)[None, :, None]
        hidden_BSH = hidden_BSH + torch.tanh(self.mix(hidden_BSH.cumsum(1) / steps_1S1))
        b, s, h = hidden_BSH.shape
        mlp_BSH: torch.Tensor = self.mlp(hidden_BSH.reshape(b * s, h)).reshape(b, s, h)
        return hidden_BSH + mlp_BSH


class TinyDecoder(nn.Module):
    def __init__(self, layers: Sequence[TinyLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class TinyMoEModel(nn.Module):
    """Token ids ``[B, S]`` to logits ``[B, S, V]``."""

    def __init__(self, vocab_size: int, hidden_size: int, layers: Sequence[TinyLayer]) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.decoder = TinyDecoder(layers)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, input_ids_BS: torch.Tensor) -> torch.Tensor:
        hidden_BSH = self.embedding(input_ids_BS)
        for layer in self.decoder.layers:
            hidden_BSH = layer(hidden_BSH)
        logits_BSV: torch.Tensor = self.head(hidden_BSH)
        return logits_BSV


def build_tiny_moe(
    *,
    num_layers: int = 4,
    moe_layer_freq: int | Sequence[int] = 1,
    vocab_size: int = 64,
    hidden_size: int = 16,
    num_experts: int = 8,
    top_k: int = 2,
    seed: int = 0,
) -> TinyMoEModel:
    """A deterministic tiny model (``seed``) in eval mode; dense layers get a plain MLP."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers = []
        layout = rr_core.LayoutConfig(num_layers=num_layers, moe_layer_freq=moe_layer_freq)
        for i, is_moe in enumerate(rr_core.moe_pattern(layout)):
            mlp: nn.Module
            if is_moe:
                mlp = TinyMoE(hidden_size, num_experts, top_k, i + 1)
            else:
                mlp = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())
            layers.append(TinyLayer(hidden_size, i + 1, mlp))
        model = TinyMoEModel(vocab_size, hidden_size, layers)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
