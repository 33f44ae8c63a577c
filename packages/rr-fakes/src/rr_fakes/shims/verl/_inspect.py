"""Reading back what verl's engine routed: every decoder router's top-k per call (forward and
backward recompute), routes of one layer column in packed order, perturbed router weights, and
rollout-style routes. Shared by the harness tests and rr's verl engine tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rr_core import LayoutConfig, moe_pattern
from rr_fakes import distinct_ids
from rr_fakes.shims.megatron._capture import RouteLog, route_log
from rr_fakes.shims.megatron._gpt import TinyGPTConfig

__all__ = [
    "RouteLog",
    "grads_ok",
    "moe_column",
    "packed",
    "perturb",
    "rollout_routes",
    "route_log",
    "routers",
    "zero_grads",
]


def routers(chunks: Sequence[nn.Module]) -> list[Any]:
    """Every decoder router of ``chunks`` (MTP routers excluded), in module order."""
    from megatron.core.transformer.moe.router import TopKRouter

    decoders: list[Any] = [getattr(c, "decoder", c) for c in chunks]
    return [m for d in decoders for m in d.modules() if isinstance(m, TopKRouter)]


def packed(routes: torch.Tensor, column: int) -> torch.Tensor:
    """Jagged ``[B, j, L, K]`` routes of one layer column, sequences packed, ids sorted."""
    return torch.cat([seq[:, column, :].long() for seq in routes.unbind()]).sort(dim=-1).values


def moe_column(tf_config: Any, layer: int, columns: int) -> int:
    """The routes column of global ``layer``: by layer when routes cover every layer, else by
    MoE ordinal (verl's ``set_router_replay_data`` rule)."""
    if columns == tf_config.num_layers:
        return layer - 1
    layout = LayoutConfig(num_layers=tf_config.num_layers, moe_layer_freq=tf_config.moe_layer_freq)
    return sum(moe_pattern(layout)[: layer - 1])


def routed_as(
    log: RouteLog,
    routes: torch.Tensor,
    tf_config: Any,
    layer: int,
    *,
    recompute: bool,
    reordered: bool = False,
) -> bool:
    """Whether ``layer``'s router routed exactly its column of the jagged ``routes`` in the logged
    forward (``recompute=False``) or recompute pass, ids sorted per row: row for row, or as a
    multiset of rows when the batch was ``reordered`` (dynamic batching)."""
    used = log.rows(layer, recompute=recompute).sort(-1).values
    target = packed(routes, moe_column(tf_config, layer, routes.shape[-2]))
    if reordered:
        return sorted(map(tuple, used.tolist())) == sorted(map(tuple, target.tolist()))
    return torch.equal(used, target)


def perturb(chunks: Sequence[nn.Module], seed: int = 7) -> None:
    """Move every router's weights so that native routing changes (replay must undo it)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in routers(chunks):
            noise = torch.randn(router.weight.shape, generator=generator)
            router.weight.add_(noise * router.weight.std() * 3)


def grads_ok(chunks: Sequence[nn.Module]) -> bool:
    """Every parameter has a finite gradient and every router weight a non-zero one."""
    params = [p for c in chunks for p in c.parameters() if p.requires_grad]
    return all(p.grad is not None and torch.isfinite(p.grad).all() for p in params) and all(
        r.weight.grad.abs().sum() > 0 for r in routers(chunks)
    )


def zero_grads(chunks: Sequence[nn.Module]) -> None:
    """Drop every gradient of ``chunks``."""
    for chunk in chunks:
        for p in chunk.parameters():
            p.grad = None


def rollout_routes(
    lengths: Sequence[int], layers: int, cfg: TinyGPTConfig, seed: int = 3
) -> list[torch.Tensor]:
    """Distinct top-k ids per row, one row short per sequence (the rollout engine never routes
    the last sampled token)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        distinct_ids(
            n - 1,
            layers,
            num_experts=cfg.num_experts,
            top_k=cfg.top_k,
            generator=generator,
            dtype=torch.int16,
        )
        for n in lengths
    ]
