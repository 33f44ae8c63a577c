"""Metas and route arrays shared by the rr-vllm tests."""

from __future__ import annotations

import numpy as np

from rr_core import RouteMeta
from rr_fakes import distinct_ids


def make_meta(
    num_experts: int = 8, dense: tuple[int, ...] = (), layers: int = 4, top_k: int = 2
) -> RouteMeta:
    """An all-layers meta whose layers in ``dense`` (1-based) have no router."""
    return RouteMeta(
        num_experts=num_experts,
        top_k=top_k,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, layers + 1)),
        moe_layer_numbers=tuple(n for n in range(1, layers + 1) if n not in dense),
    )


def distinct_routes(meta: RouteMeta, rows: int, seed: int = 0) -> np.ndarray:
    """``[rows, L, K]`` int64: K distinct ids per MoE slot, zeros on dense slots."""
    layers, e, k = len(meta.layer_numbers), meta.num_experts, meta.top_k
    ids = distinct_ids(rows, layers, num_experts=e, top_k=k, seed=seed).numpy()
    ids[:, list(meta.dense_slots)] = 0
    return ids
