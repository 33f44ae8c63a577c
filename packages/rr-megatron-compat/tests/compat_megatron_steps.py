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
from rr_fakes.megatron import TinyGPTConfig, build_gpt, gpt_inputs

E, K = 8, 2
RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}


def replay_extra(**extra: Any) -> dict[str, Any]:
    """``extra`` plus the replay flag where the line has one (what enable_replay sets)."""
    if rmc.megatron_line().native_replay:
        extra.setdefault("moe_enable_routing_replay", True)
    return extra


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
    maps: dict[int, list[torch.Tensor]] = {}
    handles = []
    for layer, router in routers(model):

        def hook(module: nn.Module, args: Any, out: Any, layer: int = layer) -> None:
            if torch._C._current_graph_task_id() == -1:
                maps.setdefault(layer, []).append(out[1].detach().clone())

        handles.append(router.register_forward_hook(hook))
    try:
        yield maps
    finally:
        for handle in handles:
            handle.remove()


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
    from megatron.core.pipeline_parallel import schedules

    chunks = list(model) if isinstance(model, Sequence) else [model]
    counter = iter(range(len(microbatches) * len(chunks)))

    def loss(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        value = output.float().mean()
        return value, {"lm loss": value.detach()}

    def forward_step(data_iterator: Iterator[Mapping[str, torch.Tensor]], chunk: nn.Module) -> Any:
        index = next(counter) % len(microbatches)
        data = next(data_iterator)
        scope: Any = contextlib.nullcontext()
        if controller is not None:
            scope = controller.microbatch(index)
        with scope as mb:
            out = chunk(
                data["input_ids"], data["position_ids"], attention_mask=None, labels=data["labels"]
            )
            if mb is not None:
                mb.track(out)
        return out, loss

    batch, seq = microbatches[0]["input_ids"].shape
    run: Callable[..., Any] = schedules.get_forward_backward_func()
    losses = run(
        forward_step_func=forward_step,
        data_iterator=iter(microbatches),
        model=chunks[0],
        num_microbatches=len(microbatches),
        seq_length=seq,
        micro_batch_size=batch,
        forward_only=forward_only,
    )
    return [float(item["lm loss"]) for item in losses]


def inputs(n: int = 1, batch: int = 2, seq: int = 8) -> list[dict[str, torch.Tensor]]:
    return [gpt_inputs(batch, seq, 64, seed=i) for i in range(n)]


def random_targets(tokens: int, layers: int, seed: int = 0) -> torch.Tensor:
    """Distinct ids per row: ``[T, L, K]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens * layers)]).view(
        tokens, layers, K
    )


def perturb(model: nn.Module, seed: int = 1) -> None:
    """Change the router weights so native routing differs from what was recorded."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, router in routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=g))
