"""Metas and route arrays shared by the rr-vllm tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, settings

from rr_core import RouteMeta, RRError
from rr_fakes import distinct_ids
from rr_fakes.emulations.engines import VllmEra, vllm_request_output


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


#: The tests' usual layout: 4 layers, the first dense, 8 experts, top-2.
META = make_meta(dense=(1,))


def distinct_routes(meta: RouteMeta, rows: int, seed: int = 0) -> np.ndarray:
    """``[rows, L, K]`` int64: K distinct ids per MoE slot, zeros on dense slots."""
    layers, e, k = len(meta.layer_numbers), meta.num_experts, meta.top_k
    ids = distinct_ids(rows, layers, num_experts=e, top_k=k, seed=seed).numpy()
    ids[:, list(meta.dense_slots)] = 0
    return ids


def fake_vllm_output(
    era: VllmEra,
    meta: RouteMeta,
    routes_TLK: np.ndarray,
    p: int,
    g: int,
    use_real_vllm: bool = False,
    **kw: Any,
) -> Any:
    """The fake's ``RequestOutput`` of ``era`` (in vLLM's own classes with ``use_real_vllm``):
    prompt ids ``100..100+p``, generated ids ``200..200+g``, routed as ``routes_TLK`` over
    ``meta``'s layers."""
    return vllm_request_output(
        era,
        prompt_ids=list(range(100, 100 + p)),
        generated_ids=list(range(200, 200 + g)),
        routes_TLK=routes_TLK,
        num_experts=meta.num_experts,
        moe_layer_numbers=meta.moe_layer_numbers,
        use_real_vllm=use_real_vllm,
        **kw,
    )


def streamed_output(
    p: int = 6, g: int = 5, start: int = 0, seed: int = 0, **kw: Any
) -> tuple[Any, np.ndarray]:
    """A vLLM 0.32+ answer (prompt ids from 10, generated from 100, sent with
    ``prompt_start=start``) over :data:`META`, and the routes it carries."""
    routes = distinct_routes(META, p + g - 1, seed=seed)
    out = vllm_request_output(
        "0.32+",
        prompt_ids=range(10, 10 + p),
        generated_ids=range(100, 100 + g),
        routes_TLK=routes,
        num_experts=8,
        prompt_start=start,
        **kw,
    )
    return out, routes


#: The mutation tests' hypothesis settings (test_vllm_outside_*).
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def outcome(parse: Callable[[], Any]) -> Any:
    """The parse's result, or the RRError it raised; any other exception fails the test."""
    try:
        result = parse()
    except RRError as e:
        event(f"raised {type(e).__name__}")
        return e
    event("decoded")
    return result
