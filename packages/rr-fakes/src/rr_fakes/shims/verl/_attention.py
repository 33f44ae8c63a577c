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

import torch
from torch import nn

from rr_fakes.shims.megatron._attention import (
    AttentionCall,
    CoreAttentionStandIn,
    causal_attention,
)


class ThdCoreAttention(CoreAttentionStandIn):
    """Causal attention per packed sequence: ``[t, heads, dim]`` in, ``[t, heads * dim]`` out,
    as Transformer Engine returns for the THD format."""

    def __init__(self, local: nn.Module) -> None:
        super().__init__()
        self.local = local
        self.scale = float(getattr(local, "softmax_scale"))  # noqa: B009 (a Module attribute)

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        packed = call.packed_seq_params
        if packed is None or packed.qkv_format != "thd":
            out: torch.Tensor = self.local(
                query,
                key,
                value,
                call.attention_mask,
                attn_mask_type=call.attn_mask_type,
                attention_bias=call.attention_bias,
                packed_seq_params=packed,
            )
            return out
        if call.attention_bias is not None:
            raise NotImplementedError("attention bias with packed sequences")
        starts = packed.cu_seqlens_q_padded
        if starts is None:
            starts = packed.cu_seqlens_q
        lengths = packed.cu_seqlens_q.diff().tolist()
        width = query.shape[1] * value.shape[-1]  # heads * value dim
        pieces: list[torch.Tensor] = []
        for start, end, length in zip(
            starts[:-1].tolist(), starts[1:].tolist(), lengths, strict=True
        ):
            rows = slice(start, start + length)
            pieces.append(causal_attention(query[rows], key[rows], value[rows], self.scale))
            if end - start > length:  # alignment padding rows: zeros
                pieces.append(query.new_zeros(end - start - length, width))
        return torch.cat(pieces, dim=0)


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
