"""Integer payloads through collectives, bit-exactly, as uint8 views.

NCCL has no int16 and gloo rejects int16 ``all_gather``; HCCL has no uint16/32/64. Viewing any
integer (or bool) tensor as bytes around the collective works on all of them and round-trips
exactly, so route ids keep their narrow storage dtype on the wire and are widened, if at all,
only by whoever consumes the gathered result.

Shape suffixes in this package: T tokens (rows), L layer slots, K top-k, M MoE layers.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rr_core import AlignmentError, RRError
from rr_core.checks import describe
from rr_megatron_compat._versions import import_megatron

_WIRE_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _dist() -> Any:
    return importlib.import_module("torch.distributed")


def as_wire_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of an integer or bool tensor (copied only if not contiguous)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _WIRE_DTYPES:
        got = f"{t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
        raise AlignmentError(
            f"route payloads must be integer or bool tensors ({', '.join(map(str, _WIRE_DTYPES))});"
            f" got a {got}; gather route ids, not scores"
        )
    if t.numel() == 0:  # an empty tensor's flat view can have stride 0, which view() refuses
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.contiguous().reshape(-1).view(torch.uint8)


def from_wire_bytes(b: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`as_wire_bytes`."""
    return b.view(dtype).reshape(shape)


def all_gather_exact(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """``all_gather`` of same-shaped integer tensors, one per rank of ``group``, as uint8 views."""
    dist = _dist()
    wire = as_wire_bytes(t)
    if not dist.is_available() or not dist.is_initialized():
        raise AlignmentError(
            "all_gather_exact needs torch.distributed initialized (init_process_group) in "
            "every rank of the group"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise AlignmentError(
            f"group must be a torch.distributed ProcessGroup or None (the default group); got "
            f"{describe(group)}"
        )
    size = dist.get_world_size(group)
    parts = [torch.empty_like(wire) for _ in range(size)]
    dist.all_gather(parts, wire, group=group)
    return [from_wire_bytes(p, t.dtype, tuple(t.shape)) for p in parts]


def group_rank_size(group: Any) -> tuple[int, int]:
    dist = _dist()
    return int(dist.get_rank(group)), int(dist.get_world_size(group))


def parallel_state(getter: str, error: type[RRError] = AlignmentError) -> Any:
    """``megatron.core.parallel_state.<getter>()``; before Megatron's parallel state is set up
    its assertion becomes ``error`` naming the fix."""
    ps = import_megatron("megatron.core.parallel_state")
    try:
        return getattr(ps, getter)()
    # "... group is not initialized" (an assertion), or on older lines torch.distributed's
    # "Default process group has not been initialized" (a ValueError)
    except (AssertionError, ValueError) as e:
        raise error(
            f"Megatron's parallel state is not set up ({getter}: {e}): call "
            "parallel_state.initialize_model_parallel(...) first, or pass the group"
        ) from e


def megatron_group(name: str) -> Any:
    """One of Megatron's process groups (``tensor_model_parallel``, ``context_parallel``,
    ``pipeline_model_parallel``) from its parallel state."""
    group = parallel_state(f"get_{name}_group")
    # A rank in several PP groups (encoder and decoder pipelines) gets a list of them, on every
    # line: a property of the parallel layout, not of the release, so it is checked on the value.
    if isinstance(group, list):
        group = group[0]
    return group
