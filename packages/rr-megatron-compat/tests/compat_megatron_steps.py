"""Shared steps of the compat tests: build tiny real GPTModels with replay enabled, run
Megatron's own schedule with rr's micro-batch context, and read the routing maps every router
produced."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import rr_megatron_compat as rmc
from rr_core import ReplayController
from rr_fakes import distinct_ids
from rr_fakes.shims.megatron import (
    RECOMPUTE,
    TinyGPTConfig,
    build_gpt,
    gpt_inputs,
    route_log,
    train_step,
)

E, K = 8, 2


def replay_extra(**extra: Any) -> dict[str, Any]:
    """``extra`` plus the replay flag where the line has one (what enable_replay sets)."""
    return {**rmc.replay_config_fields(), **extra}


def build(recompute: bool = False, **kw: Any) -> nn.Module:
    extra = dict(kw.pop("extra", {}))
    if recompute:
        extra.update(RECOMPUTE)
    return build_gpt(TinyGPTConfig(extra=replay_extra(**extra), **kw))


def routers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    from rr_core import walk_routers

    return walk_routers(model)


@contextlib.contextmanager
def capture_maps(model: nn.Module) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Every routing map ``[T, E]`` each decoder router returns in forward (not recompute)."""
    with route_log(model) as log:
        yield log.forward


def map_of(ids_TK: torch.Tensor, num_experts: int = E) -> torch.Tensor:
    return torch.zeros(ids_TK.shape[0], num_experts, dtype=torch.bool).scatter(1, ids_TK, True)


def step(
    model: nn.Module | Sequence[nn.Module],
    microbatches: Sequence[Mapping[str, torch.Tensor]],
    controller: ReplayController | None = None,
    *,
    forward_only: bool = False,
) -> list[float]:
    """Megatron's forward-backward schedule; forwards run inside ``controller.microbatch(i)``
    with the output tracked, as an RL trainer drives rr."""
    return train_step(model, microbatches, controller, forward_only=forward_only)


def inputs(n: int = 1, batch: int = 2, seq: int = 8) -> list[dict[str, torch.Tensor]]:
    return [gpt_inputs(batch, seq, 64, seed=i) for i in range(n)]


def random_targets(tokens: int, layers: int, seed: int = 0) -> torch.Tensor:
    """Distinct ids per row: ``[T, L, K]``."""
    return distinct_ids(tokens, layers, num_experts=E, top_k=K, seed=seed)


def perturb(model: nn.Module, seed: int = 1) -> None:
    """Change the router weights so native routing differs from what was recorded."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, router in routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=g))


@contextlib.contextmanager
def patched(install: Callable[[], object], uninstall: Callable[[], object]) -> Iterator[None]:
    """One model-parallel process group with ``install()`` applied, ``uninstall()`` on the way
    out: rr's Megatron hooks (``rmc.install``) or verl's patch (``apply_router_replay_patch``)."""
    from rr_fakes.shims.megatron import model_parallel

    with model_parallel():
        install()
        try:
            yield
        finally:
            uninstall()


def record_through_verl(
    model: nn.Module,
    batches: Sequence[Mapping[str, torch.Tensor]],
    mask: torch.Tensor,
    forward: Callable[[nn.Module, Mapping[str, torch.Tensor]], object],
) -> torch.Tensor:
    """R2 as verl's engine records it, through the verl names: RECORD, each micro-batch's
    forward without grad followed by ``merge_router_topk_indices``, then the routes of every
    micro-batch gathered over the pipeline (``[B, T, L, K]``)."""
    import rr_megatron_compat.verl as rv

    tc = model.config
    recorded: list[torch.Tensor] = []
    rv.RouterReplay.set_global_router_replay_action(rv.RouterReplayAction.RECORD)
    with torch.no_grad():
        for batch in batches:
            assert rv.RouterReplayHelper.is_r2_record_action(tc, model=model)
            forward(model, batch)
            rv.merge_router_topk_indices(mask, batch["input_ids"], recorded, tc, model=model)
    rv.RouterReplay.clear_global_indices()
    return rv.pp_gather(torch.cat(recorded), tc)
