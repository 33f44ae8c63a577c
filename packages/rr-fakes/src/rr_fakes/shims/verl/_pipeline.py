"""One pipeline-parallel rank of an R2 record -> replay step through verl's engine, for
:func:`rr_fakes.shims.megatron.launch` (two gloo processes, PP=2 with or without VPP=2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rr_fakes.shims.verl._batch import run_step, verl_batch
from rr_fakes.shims.verl._engine import build_verl_chunks, verl_cpu, verl_engine
from rr_fakes.shims.verl._inspect import grads_ok, packed, perturb, route_log, routers
from rr_fakes.shims.verl._tiny import PROMPTS, RESPONSES, tiny_config


def pipeline_r2_rank(
    num_layers: int,
    recompute: bool,
    switch: tuple[Callable[[], Any], Callable[[], Any]] | None = None,
) -> tuple[int, list[int], bool, bool, int]:
    """(pipeline rank, its layers, record exact, replay exact and gradients present, route
    layers). ``switch`` = (install, uninstall) of another router-replay implementation of
    verl's names, run around the step (verl's own when None)."""
    with verl_cpu():
        if switch is not None:
            switch[0]()
        try:
            return _step(num_layers, recompute)
        finally:
            if switch is not None:
                switch[1]()


def _step(num_layers: int, recompute: bool) -> tuple[int, list[int], bool, bool, int]:
    from megatron.core import parallel_state as ps

    cfg = tiny_config(recompute=recompute, num_layers=num_layers)
    chunks = build_verl_chunks(cfg, mode="R2")
    engine = verl_engine(chunks, mode="R2")
    layers = [r.layer_number for r in routers(chunks)]

    def batch(**kw: Any) -> Any:
        return verl_batch(PROMPTS, RESPONSES, cfg.vocab_size, micro_batch_size=1, **kw)

    with route_log(chunks) as native:
        record = run_step(engine, batch(enable_routing_replay=True), forward_only=True)
    last = ps.get_pipeline_model_parallel_world_size() - 1
    shared: list[Any] = [
        record["model_output"].get("routed_experts") if ps.is_pipeline_last_stage() else None
    ]
    dist.broadcast_object_list(shared, src=last)  # verl's workers hand every rank the batch
    routes = shared[0]
    recorded_ok = all(
        torch.equal(native.rows(layer, recompute=False).sort(-1).values, packed(routes, layer - 1))
        for layer in layers
    )
    perturb(chunks, seed=11 + ps.get_pipeline_model_parallel_rank())
    with route_log(chunks) as replay:
        run_step(
            engine, batch(routed_experts=routes, enable_routing_replay=True), forward_only=False
        )
    replay_ok = all(
        torch.equal(replay.rows(layer, recompute=rec).sort(-1).values, packed(routes, layer - 1))
        for layer in layers
        for rec in ([False, True] if recompute else [False])
    )
    return (
        ps.get_pipeline_model_parallel_rank(),
        layers,
        recorded_ok,
        replay_ok and grads_ok(chunks),
        routes.shape[-2],
    )
