"""The rollout's compact routes in verl's batch (the non-tensor field :data:`FIELD`, one
one-sample :class:`~rr_vllm.VerlRoutes` per sample) checked against the sequences they ride with
and expanded into the jagged int16 ``routed_experts`` verl's trainers read.

Shapes: B samples, L decoder layers, K top-k, j a sample's tokens (jagged).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rr_core import AlignmentError, decode_routes_into
from rr_core.buffers import zeros
from rr_core.checks import check_sequence, check_tensor, describe
from rr_vllm.errors import EngineOutputError
from rr_vllm.verl.routes import VERL_DTYPE, VerlRoutes

#: The non-tensor field of verl's batch that carries each sample's compact routes.
FIELD = "rr_routes"


def expand_samples(
    parts: Sequence[VerlRoutes | None],
    offsets_B1: torch.Tensor,
    trained_B: torch.Tensor,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The jagged ``[B, j, L, K]`` int16 ``routed_experts`` of one-sample routes (None where a
    sample has none), laid on the batch's rows (``offsets_B1``, the jagged ``input_ids``'
    offsets), equal to verl's own tensor. None when no sample has routes; a sample without
    routes is refused where it has trained tokens (``trained_B``), and left zero otherwise."""
    present = check_parts(parts, offsets_B1, trained_B)
    if not present:
        return None
    meta = present[0][1].meta
    dev = _device(device, offsets_B1.device)
    out_NLK = zeros((int(offsets_B1[-1]), len(meta.layer_numbers), meta.top_k), VERL_DTYPE, dev)
    starts = offsets_B1.tolist()
    for i, part in present:
        decode_routes_into(part.encoded, out_NLK[starts[i] : starts[i + 1]])
    return torch.nested.nested_tensor_from_jagged(out_NLK, offsets_B1.to(dev, torch.int64))


def check_parts(
    parts: Sequence[VerlRoutes | None], offsets_B1: torch.Tensor, trained_B: torch.Tensor
) -> list[tuple[int, VerlRoutes]]:
    """The samples that carry routes, by index, once each is checked against the batch's
    sequence it rides with (one agent-loop sample of one model, as many tokens as the
    sequence); a sample without routes is refused where it has trained tokens."""
    parts = check_sequence(parts, "expand_samples' parts", EngineOutputError, of=_PART)
    offsets_B1 = check_tensor(offsets_B1, "offsets_B1", AlignmentError, ndim=1, integer=True)
    trained_B = check_tensor(trained_B, "trained_B", AlignmentError, ndim=1)
    b = len(parts)
    lengths = offsets_B1.diff().tolist() if offsets_B1.numel() else []
    if offsets_B1.numel() and (int(offsets_B1[0]) != 0 or min(lengths, default=0) < 0):
        raise AlignmentError(f"offsets_B1 must start at 0 and never fall; got {offsets_B1}")
    if len(lengths) != b or trained_B.shape != (b,):
        raise AlignmentError(
            f"{b} samples of routes for a batch of {len(lengths)} sequences and "
            f"{tuple(trained_B.shape)} response masks"
        )
    present = [(i, p) for i, p in enumerate(parts) if p is not None]
    if not present:
        return present
    meta = present[0][1].meta
    for i, part in enumerate(parts):
        if part is None:
            if bool(trained_B[i]):
                raise EngineOutputError(
                    f"sample {i} of the batch has no routes but trained response tokens, while "
                    f"{len(present)} of {b} samples have routes: the engine returned none for it"
                    " (an aborted or preempted request?). Drop the sample or re-roll it. "
                    "D3: see `rr explain D3`"
                )
        elif part.num_samples != 1 or part.meta != meta or part.lengths[0] != lengths[i]:
            raise AlignmentError(
                f"sample {i}: routes of {part.num_samples} samples, T={list(part.lengths)}, meta "
                f"{part.meta}; the batch's sequence has {lengths[i]} tokens and sample "
                f"{present[0][0]}'s meta is {meta}: every sample must be one agent-loop sample "
                "of one model"
            )
    return present


_PART = (VerlRoutes, type(None))


def _device(value: object, default: torch.device) -> torch.device:
    if value is None:
        return default
    try:
        device: torch.device = torch.device(value)  # type: ignore[call-overload]
    except (TypeError, RuntimeError, ValueError) as e:
        raise EngineOutputError(f"device must name a torch device; got {describe(value)}") from e
    return device


def items_of(value: Any, size: int) -> list[Any]:
    """The per-sample objects of a TensorDict's non-tensor entry (a stack, or one value that
    tensordict keeps once when every sample holds the same, such as None)."""
    if hasattr(value, "tolist"):
        items = list(value.tolist())
    else:
        items = [getattr(value, "data", value)] * size
    if len(items) != size:
        raise AlignmentError(f"{FIELD} holds {len(items)} samples; the batch has {size}")
    for i, item in enumerate(items):
        if item is not None and not isinstance(item, VerlRoutes):
            raise EngineOutputError(
                f"{FIELD}[{i}] is a {type(item).__name__}; rr stores a VerlRoutes or None there"
            )
    return items


def trained_samples(data: Any) -> torch.Tensor:
    """Which samples of a verl batch have a trained response token (``response_mask``
    padded ``[B, R]`` or jagged)."""
    mask: torch.Tensor = data["response_mask"]
    if mask.is_nested:
        return torch.tensor([bool(m.any()) for m in mask.unbind()])
    return mask.bool().any(dim=-1)
