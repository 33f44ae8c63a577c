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

from rr_fakes.shims.megatron._attention import (
    AttentionCall,
    CoreAttentionStandIn,
    causal_attention,
)


class MLACoreAttention(CoreAttentionStandIn):
    """Causal softmax attention, ``softmax_scale`` as MLA computes it (no dropout)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, **kwargs: Any) -> None:
        super().__init__()
        scale = kwargs.get("softmax_scale")  # None: 1 / sqrt(key width), SDPA's default
        self.softmax_scale = None if scale is None else float(scale)

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        if call.packed_seq_params is not None or call.attention_bias is not None:
            raise NotImplementedError("MLACoreAttention runs unpacked batches without a bias")
        return causal_attention(query, key, value, self.softmax_scale)
