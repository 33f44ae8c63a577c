"""verl's ``routed_experts`` and the token order a micro-batch's routers see.

verl's trainer batch holds routes as a jagged ``[B, j, L, K]`` tensor, one ``[T_b, L, K]``
block per sequence (prompt and response), in the order of the jagged ``input_ids``: what the
rollout returned (R3; ``T_b`` or ``T_b - 1`` rows) or what the old-policy forward recorded (R2).
verl's FSDP engine feeds a micro-batch either packed into one row (``use_remove_padding``: the
jagged tokens in order, ``position_ids`` restarting at 0) or right-padded to the longest
sequence with an attention mask; rr arms the routes for whichever it does.

Shapes: B sequences, T_b tokens of sequence b, N = sum T_b, S padded length, L layer slots,
K top-k.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rr_core import RouteBatch, RouteMeta
from rr_transformers.verl._errors import VerlFSDPReplayError


def route_meta(
    routed: torch.Tensor, *, num_experts: int, top_k: int, moe_layers: tuple[int, ...], layers: int
) -> RouteMeta:
    """The layer axis of ``routed`` ``[B, j, L, K]``: one slot per MoE layer (what verl's
    engines record) or one per decoder layer (what vLLM and SGLang return)."""
    slots, k = int(routed.shape[-2]), int(routed.shape[-1])
    if k != top_k:
        raise VerlFSDPReplayError(f"routed_experts holds top-{k} ids; the model routes top-{top_k}")
    if slots == len(moe_layers):
        return RouteMeta(
            num_experts=num_experts, top_k=top_k, layer_axis="moe_layers", layer_numbers=moe_layers
        )
    if slots == layers:
        return RouteMeta(
            num_experts=num_experts,
            top_k=top_k,
            layer_axis="all_layers",
            layer_numbers=tuple(range(1, layers + 1)),
            moe_layer_numbers=moe_layers,
        )
    raise VerlFSDPReplayError(
        f"routed_experts has {slots} layer slots; the model has {len(moe_layers)} MoE layers "
        f"(layers {list(moe_layers)}) of {layers} decoder layers: expected one slot per MoE "
        "layer or one per decoder layer"
    )


def offsets(jagged: torch.Tensor) -> torch.Tensor:
    """A jagged tensor's ``[B + 1]`` row offsets."""
    found: torch.Tensor = jagged.offsets()  # type: ignore[attr-defined]
    return found


def _response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    if response_mask.is_nested:
        return torch.stack([row.sum() for row in response_mask.unbind()]).to(torch.int64)
    return response_mask.sum(dim=-1).to(torch.int64)


def route_batch(
    routed: torch.Tensor,
    input_ids: torch.Tensor,
    meta: RouteMeta,
    *,
    response_mask: torch.Tensor | None,
) -> RouteBatch:
    """``routed`` as a :class:`~rr_core.RouteBatch` whose valid rows are the ones to replay.

    With ``response_mask`` (R3) the last token of every sequence routes natively, and every
    token of a sequence without a response, as verl's Megatron engine replays rollout routes:
    the rollout engine never ran the last sampled token, and its logits are never read. Without
    it (R2: routes recorded by this model's own forward) every row replays."""
    if not routed.is_nested:
        raise VerlFSDPReplayError(
            f"routed_experts must be a jagged [B, j, L, K] tensor, as verl's no-padding batch "
            f"holds it; got a dense {list(routed.shape)} tensor"
        )
    parts = list(routed.unbind())
    if len(parts) != input_ids.shape[0]:
        raise VerlFSDPReplayError(
            f"routed_experts holds {len(parts)} sequences; the micro-batch has {input_ids.shape[0]}"
        )
    valid: list[torch.Tensor] | None = None
    if response_mask is not None:
        tokens_B = offsets(input_ids).diff().tolist()
        responses_B = _response_lengths(response_mask).tolist()
        valid = []
        for part, tokens, response in zip(parts, tokens_B, responses_B, strict=True):
            keep = tokens - 1 if response > 0 else 0
            valid.append(torch.arange(part.shape[0], device=part.device) < keep)
    return RouteBatch.from_sequences(parts, meta, valid=valid)


def packed_position_ids(micro_batch: Any) -> torch.Tensor:
    """The ``[1, N]`` position ids verl's FSDP engine hands a packed micro-batch's model."""
    position_ids = micro_batch["position_ids"]
    if position_ids.dim() != 2:
        raise VerlFSDPReplayError(
            f"position_ids of {position_ids.dim() - 1} rows per token (multimodal rotary "
            "positions) are not supported: rr arms packed micro-batches by text positions "
            "[B, j]"
        )
    packed: torch.Tensor = position_ids.values().unsqueeze(0)
    return packed


def padded_attention_mask(input_ids: torch.Tensor) -> torch.Tensor:
    """The ``[B, S]`` mask verl's FSDP engine builds for a padded micro-batch (its own
    function, so rr lays the routes out as the model will see the tokens)."""
    padding = importlib.import_module("verl.workers.utils.padding")
    longest = int(offsets(input_ids).diff().max())
    mask: torch.Tensor = padding.build_attention_mask_from_nested(
        input_ids=input_ids, max_seq_len=longest
    )
    return mask


def recorded_jagged(
    recorded_NLK: torch.Tensor, input_ids: torch.Tensor, attention_mask_BS: torch.Tensor | None
) -> torch.Tensor:
    """A micro-batch's recorded router rows as verl's jagged ``[b, j, L, K]``: the packed rows
    as they are, a padded batch's real tokens row by row."""
    rows = recorded_NLK
    if attention_mask_BS is not None:
        rows = rows[attention_mask_BS.to(torch.bool).flatten().to(rows.device)]
    starts = offsets(input_ids).to(rows.device)
    return torch.nested.nested_tensor_from_jagged(rows.contiguous(), offsets=starts)
