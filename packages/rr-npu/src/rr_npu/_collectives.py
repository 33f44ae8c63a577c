"""One payload policy for route ids in collectives.

Route ids travel narrow: int16 (or uint8 up to 256 experts). HCCL takes int16 as it is; NCCL
has no int16 and gloo (torch 2.13) rejects int16 ``all_gather``, so there the payload goes as a
uint8 view, which round-trips bit-exactly. Ids are widened to int64 only at the point of
``torch.gather`` / indexing (:func:`ids_for_gather`), never on the wire: an int64 routes tensor
is 4x the bytes of the int16 one (the 45 GB broadcast that timed out on an NPU cluster, F2).

The HCCL dtype table is data here (dtype names, no torch import); the emulated torch_npu in
rr_fakes reads it from here, so there is one table.

Shape suffixes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rr_core import RRError

#: dtypes HCCL collectives accept, by ``str(torch.dtype)`` without the ``torch.`` prefix.
HCCL_COLLECTIVE_DTYPES: frozenset[str] = frozenset(
    {"int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32"}
)
#: Integer payload dtypes routes may travel as.
PAYLOAD_DTYPES: frozenset[str] = frozenset({"bool", "uint8", "int8", "int16"})
BYTE_VIEW_BACKENDS: frozenset[str] = frozenset({"nccl", "gloo"})


class PayloadPolicyError(RRError, ValueError):
    """A routes payload that the policy does not send (too wide, or not integer)."""


@dataclass(frozen=True)
class WirePlan:
    """How one payload dtype crosses one backend."""

    payload_dtype: str
    backend: str
    wire_dtype: str  # what the collective sees
    byte_view: bool


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def wire_plan(dtype: Any, backend: str) -> WirePlan:
    """The policy for ``dtype`` over ``backend`` (``hccl`` / ``nccl`` / ``gloo``)."""
    if not isinstance(backend, str):
        raise PayloadPolicyError(
            f"backend must be 'hccl', 'nccl' or 'gloo'; got {backend!r} ({type(backend).__name__})"
        )
    name, backend = _name(dtype), backend.lower()
    if name not in PAYLOAD_DTYPES:
        raise PayloadPolicyError(
            f"routes travel as {sorted(PAYLOAD_DTYPES)}; got {name}. Narrow the ids first "
            "(int16 holds any expert id) and widen them with ids_for_gather() where they index"
        )
    if backend == "hccl":
        if name not in HCCL_COLLECTIVE_DTYPES:  # bool: HCCL has no bool collective
            return WirePlan(name, backend, "uint8", True)
        return WirePlan(name, backend, name, False)
    if backend in BYTE_VIEW_BACKENDS:
        return WirePlan(name, backend, "uint8", name != "uint8")
    raise PayloadPolicyError(f"backend must be 'hccl', 'nccl' or 'gloo'; got {backend!r}")


def _dist() -> Any:
    return importlib.import_module("torch.distributed")


def group_backend(group: Any = None) -> str:
    """The backend of ``group`` as torch.distributed reports it (read at call time)."""
    return str(_dist().get_backend(group)).lower()


def all_gather_routes(ids: Any, group: Any = None, *, backend: str | None = None) -> list[Any]:
    """``all_gather`` of same-shaped narrow route tensors by the policy; returns one tensor per
    rank in the payload's own dtype. ``backend`` defaults to the group's."""
    import torch

    _check_ids(ids, "all_gather_routes")
    if backend is not None and not isinstance(backend, str):
        raise PayloadPolicyError(
            f"backend must be None (the group's), 'hccl', 'nccl' or 'gloo'; got {backend!r}"
        )
    dist = _dist()
    if backend is None:
        _check_group(dist, group)
        backend = group_backend(group)
    plan = wire_plan(ids.dtype, backend)
    _check_group(dist, group)
    payload = ids.contiguous()
    wire = payload.reshape(-1).view(torch.uint8) if plan.byte_view else payload
    parts = [torch.empty_like(wire) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, wire, group=group)
    if not plan.byte_view:
        return parts
    return [p.view(payload.dtype).reshape(payload.shape) for p in parts]


def _check_group(dist: Any, group: Any) -> None:
    """:class:`PayloadPolicyError` unless torch.distributed is initialised and ``group`` is
    None (the default group) or a ``ProcessGroup``."""
    if not (dist.is_available() and dist.is_initialized()):
        raise PayloadPolicyError(
            "all_gather_routes needs an initialised torch.distributed (init_process_group "
            "first); got none"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise PayloadPolicyError(
            "all_gather_routes takes group=None (the default group) or a torch.distributed "
            f"ProcessGroup; got {group!r} ({type(group).__name__})"
        )


def _check_ids(ids: Any, where: str) -> None:
    import torch

    if not isinstance(ids, torch.Tensor):
        raise PayloadPolicyError(
            f"{where} takes route ids as a torch.Tensor; got {type(ids).__name__}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise PayloadPolicyError(
            f"{where} takes integer route ids; got a {ids.dtype} tensor of shape "
            f"{tuple(ids.shape)} (scores are not routes)"
        )


def ids_for_gather(ids: Any) -> Any:
    """Route ids as int64, for ``torch.gather`` / indexing: the one place they are widened."""
    import torch

    _check_ids(ids, "ids_for_gather")
    if ids.dtype is torch.bool:
        raise PayloadPolicyError("ids_for_gather takes integer route ids; got a bool tensor")

    return ids.to(torch.int64)
