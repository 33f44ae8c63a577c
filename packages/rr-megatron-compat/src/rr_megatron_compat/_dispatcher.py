"""C1: duplicate expert ids in a replayed row.

A row that repeats an id collapses in the ``[T, E]`` routing map (fewer than K experts set),
while Megatron's alltoall dispatcher sizes its dropless output as ``tokens * topk``. rr keeps
such rows from ever reaching the dispatcher: every target is checked when it is armed (one host
sync per micro-batch, not per layer) and a repeated id raises naming the layer and row, so
rr's own path never sends one. Routes armed with ``validate=False`` can; for those the alltoall
dispatcher is sized from the routing map (:func:`alltoall_preprocess_wrapper`, a host sync per
layer that only such routes pay: checked routes keep Megatron's ``T * K``); the allgather
dispatcher already sizes from the map. :func:`count_routed_tokens` gives the true
output size where routes come from elsewhere (e.g. armed with ``validate=False``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from rr_core import ReplayError
from rr_core.replay.controller import replayed_unchecked_ids
from rr_megatron_compat._checks import check_tensor

_STATE = threading.local()


def mark_replayed() -> None:
    """Called by the routing hook after a router replayed: the next alltoall ``preprocess`` on
    this thread belongs to that router's MoE layer. Only ids armed with ``validate=False`` can
    repeat in a row; targets checked at arming leave Megatron's count as it is (no host sync)."""
    _STATE.replayed = replayed_unchecked_ids()


def alltoall_preprocess_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``MoEAlltoAllTokenDispatcher.preprocess``: after a replayed routing, size the dropless
    output from the routing map itself (a row that repeats an id sets fewer than K experts).
    Costs one host sync per MoE layer that replayed unchecked ids with the alltoall dispatcher;
    layers that did not replay, or replayed targets checked at arming, are untouched."""
    replayed = getattr(_STATE, "replayed", False)
    _STATE.replayed = False
    result = wrapped(*args, **kwargs)
    if replayed and isinstance(getattr(instance, "num_out_tokens", None), int):
        routing_map = kwargs.get("routing_map", args[0] if args else None)
        if routing_map is not None:
            instance.num_out_tokens = routed_pairs(routing_map)
    return result


def routed_pairs(routing_map_TE: torch.Tensor) -> int:
    """The (token, expert) pairs of a routing map, on the host (a sync on an accelerator)."""
    return int(routing_map_TE.sum())


def count_routed_tokens(routing_map_TE: torch.Tensor) -> torch.Tensor:
    """How many (token, expert) pairs a routing map dispatches (a device tensor, no sync)."""
    check_tensor(
        routing_map_TE, "routing_map_TE (the [T, E] bool routing map)", ReplayError, ndim=2
    )
    return routing_map_TE.sum()
