"""Reading back what every decoder router routed: one forward hook per router records each
routing map ``[T, E]`` it returns, in call order, and whether the call was a forward or the
recompute of a checkpointed forward inside backward.

A call made while autograd's engine runs a backward is a recompute (the test rr_core's
controller uses too), so this holds for Megatron's and torch's activation checkpointing alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rr_core import walk_routers


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


def map_ids(routing_map_TE: torch.Tensor) -> torch.Tensor:
    """The expert ids ``[T, K]`` of a routing map, ascending per row."""
    return routing_map_TE.nonzero()[:, 1].view(routing_map_TE.shape[0], -1)


class RouteLog:
    """Every routing map the decoder routers returned. ``calls`` holds ``(layer, recompute,
    map_TE)`` in call order; ``forward`` and ``recompute`` hold the maps per layer, in call
    order (micro-batch order: the schedules run each chunk's micro-batches in order)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool, torch.Tensor]] = []
        self.forward: dict[int, list[torch.Tensor]] = {}
        self.recompute: dict[int, list[torch.Tensor]] = {}

    def record(self, layer: int, output: Any) -> None:
        routing_map = output[1].detach().clone()
        recompute = _in_backward()
        self.calls.append((layer, recompute, routing_map))
        (self.recompute if recompute else self.forward).setdefault(layer, []).append(routing_map)

    def rows(self, layer: int, *, recompute: bool) -> torch.Tensor:
        """Expert ids of every token row routed at ``layer`` in call order, ``[rows, K]``."""
        maps = (self.recompute if recompute else self.forward).get(layer, [])
        if not maps:
            return torch.empty(0, 0, dtype=torch.long)
        return torch.cat([map_ids(m) for m in maps])

    def id_lists(self) -> dict[str, dict[int, list[list[list[int]]]]]:
        """Plain data (for a rank process to return): per phase and layer, the ascending ids of
        every row of every call (a row may hold fewer than K: a repeated id collapses)."""
        phases = {"forward": self.forward, "recompute": self.recompute}
        return {
            phase: {layer: [_row_lists(m) for m in maps] for layer, maps in per.items()}
            for phase, per in phases.items()
        }


def _row_lists(routing_map_TE: torch.Tensor) -> list[list[int]]:
    return [row.nonzero().flatten().tolist() for row in routing_map_TE]


@contextmanager
def route_log(model: nn.Module | Sequence[nn.Module]) -> Iterator[RouteLog]:
    """Record every routing map the decoder routers of ``model`` (or its chunks) return while
    the block runs (MTP routers are not on the decoder axis and are left out)."""
    log = RouteLog()
    with contextlib.ExitStack() as hooks:
        for layer, router in walk_routers(list(model) if isinstance(model, Sequence) else model):

            def hook(module: nn.Module, args: Any, output: Any, layer: int = layer) -> None:
                log.record(layer, output)

            hooks.enter_context(router.register_forward_hook(hook))
        yield log
