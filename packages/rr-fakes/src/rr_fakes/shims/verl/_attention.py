"""Packed-sequence (THD) attention for Megatron's local layer spec.

verl's engine packs a micro-batch's sequences into one row (``use_remove_padding=True``) and
hands Megatron a ``PackedSeqParams`` with ``qkv_format="thd"``. On a GPU Transformer Engine's
attention reads the sequence boundaries from it; Megatron's local ``DotProductAttention``
refuses packed input. :class:`ThdCoreAttention` takes its place in each self-attention:
causal attention within each packed sequence, zeros on alignment padding rows, and the wrapped
local module unchanged for unpacked input.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional


class ThdCoreAttention(nn.Module):
    """Causal attention per packed sequence: ``[t, heads, dim]`` in, ``[t, heads * dim]`` out,
    as Transformer Engine returns for the THD format."""

    def __init__(self, local: nn.Module) -> None:
        super().__init__()
        self.local = local
        self.scale = float(getattr(local, "softmax_scale"))  # noqa: B009 (a Module attribute)

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
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            out: torch.Tensor = self.local(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type=attn_mask_type,
                attention_bias=attention_bias,
                packed_seq_params=packed_seq_params,
            )
            return out
        if attention_bias is not None:
            raise NotImplementedError("attention bias with packed sequences")
        starts = packed_seq_params.cu_seqlens_q_padded
        if starts is None:
            starts = packed_seq_params.cu_seqlens_q
        lengths = packed_seq_params.cu_seqlens_q.diff().tolist()
        heads, groups = query.shape[1], key.shape[1]
        pieces: list[torch.Tensor] = []
        for start, end, length in zip(
            starts[:-1].tolist(), starts[1:].tolist(), lengths, strict=True
        ):
            q = query[start : start + length].transpose(0, 1)
            k = key[start : start + length].transpose(0, 1)
            v = value[start : start + length].transpose(0, 1)
            if groups != heads:
                k = k.repeat_interleave(heads // groups, dim=0)
                v = v.repeat_interleave(heads // groups, dim=0)
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            pieces.append(out.transpose(0, 1))
            if end - start > length:
                pieces.append(query.new_zeros(end - start - length, heads, value.shape[-1]))
        context = torch.cat(pieces, dim=0)
        return context.reshape(context.shape[0], heads * value.shape[-1])


def use_thd_attention(chunks: Iterable[nn.Module]) -> int:
    """Wrap every local ``core_attention`` in ``chunks`` with :class:`ThdCoreAttention` (no
    parameters move: the local module holds none that THD needs, and it stays inside). Returns
    how many were wrapped; calling it again wraps nothing."""
    wrapped = 0
    for chunk in chunks:
        for module in list(chunk.modules()):
            core = getattr(module, "core_attention", None)
            if isinstance(core, nn.Module) and not isinstance(core, ThdCoreAttention):
                module.core_attention = ThdCoreAttention(core)
                wrapped += 1
    return wrapped
