"""R3 (engine routes) on the training inputs' rows, under verl's function names (see
:mod:`rr_megatron_compat.verl`)."""

from __future__ import annotations

import torch

import rr_core
from rr_core import AlignmentError
from rr_megatron_compat._checks import check_tensor
from rr_megatron_compat.verl._layers import offsets


def align_r3_router_replay_data(
    layers_topk_idx: torch.Tensor, input_ids: torch.Tensor
) -> torch.Tensor:
    """Engine routes (jagged ``[B, j, L, K]``) on the training inputs' rows: ``j`` must be the
    input length or one less (the last sampled token was never fed back); the missing row is a
    zero placeholder the replay mask leaves native."""
    check_tensor(
        layers_topk_idx,
        "layers_topk_idx (jagged [B, j, L, K] ids)",
        AlignmentError,
        ndim=4,
        integer=True,
    )
    check_tensor(input_ids, "input_ids (jagged [B, j])", AlignmentError, ndim=2)
    if not (layers_topk_idx.is_nested and input_ids.is_nested):
        raise AlignmentError("R3 alignment takes jagged (nested) routes and input_ids")
    route_at, input_at = offsets(layers_topk_idx).cpu(), offsets(input_ids).cpu()
    if route_at.numel() != input_at.numel():
        raise AlignmentError(
            f"{route_at.numel() - 1} route sequences for {input_at.numel() - 1} input sequences"
        )
    route_lens, input_lens = route_at.diff(), input_at.diff()
    short = input_lens - route_lens
    bad = ((short < 0) | (short > 1)).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        raise AlignmentError(
            f"sample {b}: {int(route_lens[b])} route rows for {int(input_lens[b])} input tokens; "
            "expected equal lengths or exactly one missing final route"
        )
    values = layers_topk_idx.values()
    if not bool(short.any()):
        return torch.nested.nested_tensor_from_jagged(values, input_at.to(values.device))
    aligned = values.new_empty((int(input_at[-1]), *values.shape[1:]))
    route_starts, input_starts = route_at.tolist(), input_at.tolist()
    for b in range(len(input_starts) - 1):  # one slice copy per sequence, one zero row or none
        start, stop = route_starts[b], route_starts[b + 1]
        to = input_starts[b] + stop - start
        aligned[input_starts[b] : to] = values[start:stop]
        aligned[to : input_starts[b + 1]] = 0
    return torch.nested.nested_tensor_from_jagged(aligned, input_at.to(values.device))


def build_r3_replay_mask(input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Jagged bool mask on ``input_ids``' rows: every row of a sequence with a response except
    its last (:func:`rr_core.replay_mask_for_lengths`: the engine routed no last sampled
    token); sequences without a response stay native."""
    check_tensor(input_ids, "input_ids (jagged [B, j])", AlignmentError, ndim=2)
    check_tensor(response_mask, "response_mask ([B, R])", AlignmentError, ndim=2)
    if not input_ids.is_nested:
        raise AlignmentError("build_r3_replay_mask takes jagged (nested) input_ids")
    starts = offsets(input_ids)
    lengths = starts.diff()
    mask = rr_core.replay_mask_for_lengths(lengths, missing_last=True)
    mask &= torch.repeat_interleave((response_mask.sum(dim=-1) > 0).to(mask.device), lengths)
    return torch.nested.nested_tensor_from_jagged(mask, starts)
