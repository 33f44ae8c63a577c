"""Core attention for MLA on Megatron's local layer spec.

MLA's keys are wider than its values (``qk_head_dim + qk_pos_emb_head_dim`` against
``v_head_dim``), so ``MLASelfAttention`` builds its core attention with ``k_channels`` /
``v_channels``, which only Transformer Engine's attention takes; Megatron's local
``DotProductAttention`` refuses them. :class:`MLACoreAttention` is the causal attention of one
unpacked ``[sq, b, heads, dim]`` batch with those widths, in Megatron's output layout
``[sq, b, heads * v_dim]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional


class MLACoreAttention(nn.Module):
    """Causal softmax attention, ``softmax_scale`` as MLA computes it (no dropout)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, **kwargs: Any) -> None:
        super().__init__()
        scale = kwargs.get("softmax_scale")  # None: 1 / sqrt(key width), SDPA's default
        self.softmax_scale = None if scale is None else float(scale)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("MLACoreAttention runs unpacked batches without a bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, dim]
        out = functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale
        )
        sq, b, heads = query.shape[0], query.shape[1], query.shape[2]
        return out.permute(2, 0, 1, 3).reshape(sq, b, heads * value.shape[-1])
