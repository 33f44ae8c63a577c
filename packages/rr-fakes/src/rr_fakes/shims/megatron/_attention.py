"""What the harness's stand-ins for Megatron's core attention share: Megatron's call (the
signature ``DotProductAttention.forward`` has, which ``Attention`` calls) and causal softmax
attention over Megatron's sequence-first layout, query groups expanded to the query heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional


@dataclass(frozen=True)
class AttentionCall:
    """The rest of Megatron's core-attention call, which a stand-in passes on or refuses."""

    attention_mask: torch.Tensor | None
    attn_mask_type: Any = None
    attention_bias: torch.Tensor | None = None
    packed_seq_params: Any = None


class CoreAttentionStandIn(nn.Module):
    """A module in the place of Megatron's core attention: Megatron's call in, :meth:`attend`
    (each stand-in's own) out."""

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
        call = AttentionCall(attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        return self.attend(query, key, value, call)

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define attend()")


def causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Causal softmax attention of sequence-first ``[s, ..., heads, dim]`` tensors (keys and
    values may have fewer heads: query groups), as Megatron's core attention returns it:
    ``[s, ..., heads * value dim]``. ``scale`` None: ``1 / sqrt(key dim)``."""
    heads, groups = query.shape[-2], key.shape[-2]
    q, k, v = (t.movedim(0, -2) for t in (query, key, value))  # [..., heads, s, dim]
    if groups != heads:
        k = k.repeat_interleave(heads // groups, dim=-3)
        v = v.repeat_interleave(heads // groups, dim=-3)
    out = functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return out.movedim(-2, 0).flatten(-2)
