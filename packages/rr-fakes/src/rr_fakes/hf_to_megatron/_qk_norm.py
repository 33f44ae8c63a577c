"""OLMoE's q / k norms for a Megatron ``SelfAttention``: one RMSNorm over every head's
projection at once (HF's ``q_norm`` over ``num_heads * head_dim``, ``k_norm`` over
``num_kv_heads * head_dim``), where Megatron's ``qk_layernorm`` normalises each head alone.

They plug into the layer spec's ``q_layernorm`` / ``k_layernorm`` slots, which Megatron
builds with ``(hidden_size=head_dim, config, eps)`` and calls on ``[sq, b, heads, head_dim]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _AllHeadsRMSNorm(nn.Module):
    heads_field = "num_attention_heads"

    def __init__(self, hidden_size: int, config: Any, eps: float = 1e-6) -> None:
        super().__init__()
        heads = int(getattr(config, self.heads_field))
        self.weight = nn.Parameter(torch.ones(heads * hidden_size))
        self.eps = eps

    def forward(self, x_SBNH: torch.Tensor) -> torch.Tensor:
        flat = x_SBNH.flatten(-2).to(torch.float32)  # HF's RMSNorm computes in float32
        normed = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed.to(x_SBNH.dtype)).view_as(x_SBNH)


class QueryHeadsRMSNorm(_AllHeadsRMSNorm):
    """``q_norm``: over ``num_attention_heads * head_dim``."""


class KeyHeadsRMSNorm(_AllHeadsRMSNorm):
    """``k_norm``: over ``num_query_groups * head_dim`` (the key-value heads)."""

    heads_field = "num_query_groups"
