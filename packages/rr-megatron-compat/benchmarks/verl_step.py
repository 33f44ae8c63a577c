"""bench_verl's training-step workload: a Megatron step with no replay, verl's replay, rr's
drop-in and rr's own API, on the same targets."""

from __future__ import annotations

import argparse
import gc
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from verl_measure import Samples, now, since
from verl_models import Shape, Verl, build, jagged, lengths_of, rollout_routes

import rr_megatron_compat as rmc
import rr_megatron_compat.verl as rv
from rr_core import ReplayController, ReplayMode

# -- workload 3: training step -----------------------------------------------------------------


def step(
    model: nn.Module,
    batches: Sequence[Mapping[str, torch.Tensor]],
    before: Callable[[int], None],
    after: Callable[[int, torch.Tensor], None],
) -> list[float]:
    """Forward and backward of ``batches`` through Megatron's schedule; ``before(mb)`` and
    ``after(mb, output)`` run around each micro-batch's forward."""
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    counter = iter(range(len(batches)))

    def loss_fn(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = output.float().mean()
        return loss, {"lm loss": loss.detach()}

    def forward_step(data: Iterator[Mapping[str, torch.Tensor]], chunk: nn.Module) -> Any:
        batch, mb = next(data), next(counter)
        before(mb)
        output = chunk(
            batch["input_ids"], batch["position_ids"], attention_mask=None, labels=batch["labels"]
        )
        after(mb, output)
        return output, loss_fn

    losses = schedules.get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=model,
        num_microbatches=len(batches),
        seq_length=batches[0]["input_ids"].shape[1],
        micro_batch_size=1,
        forward_only=False,
    )
    return [float(item["lm loss"]) for item in losses]


def run_step(verl: Verl, args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(
        args.step_layers, args.experts, args.topk, args.step_hidden, args.step_tokens, True
    )
    models = {
        "off": build(shape, None, args.expert_tree),
        "verl": build(shape, verl, args.expert_tree),
        "rr_dropin": build(shape, None, args.expert_tree),
        "rr_api": build(shape, None, args.expert_tree),
    }
    for model in models.values():  # one set of weights: every side routes the same tokens
        model.load_state_dict(models["off"].state_dict())
    lengths = lengths_of(args.step_tokens, 2)
    g = torch.Generator().manual_seed(5)
    batches, ids = [], []
    for _ in range(args.step_microbatches):
        tokens = torch.randint(0, 64, (1, args.step_tokens + 1), generator=g)
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        batches.append(
            {"input_ids": tokens[:, :-1], "position_ids": positions, "labels": tokens[:, 1:]}
        )
        ids.append(jagged(list(tokens[0, :-1].split(lengths))))
    response = torch.ones(len(lengths), 16, dtype=torch.int64)
    tc = {side: model.config for side, model in models.items()}
    routes: list[Any] = []  # engine format, jagged int16 [B, j, L, K]
    packed: list[tuple[torch.Tensor, torch.Tensor]] = []  # rr's API: [T, L, K] rows, [T] mask
    controller = ReplayController(num_experts=shape.experts, top_k=shape.topk)
    rmc.attach(controller, models["rr_api"])
    scopes: list[Any] = []

    def use(engine_routes: list[Any]) -> None:
        routes[:] = engine_routes
        packed.clear()
        for mb, r in enumerate(routes):
            aligned = rv.align_r3_router_replay_data(r, ids[mb])
            mask = rv.build_r3_replay_mask(ids[mb], response)
            packed.append((aligned.values().to(torch.int64), mask.values()))

    def engine(api: Any, side: str) -> tuple[Callable[[int], None], Callable[[int, Any], None]]:
        model, config, act = models[side], tc[side], api.RouterReplayAction
        helper = api.RouterReplayHelper

        def before(mb: int) -> None:
            if helper.is_replay_backward_action(config, 0, model=model):
                api.set_model_router_replay_action(model, act.REPLAY_FORWARD)
            if helper.is_replay_forward_action(config, 0, model=model):
                aligned = api.align_r3_router_replay_data(routes[mb], ids[mb])
                mask = api.build_r3_replay_mask(ids[mb], response)
                api.set_router_replay_data(aligned, None, config, 0, replay_mask=mask, model=model)

        def after(mb: int, output: Any) -> None:
            if helper.is_replay_forward_action(config, 0, model=model):
                api.set_model_router_replay_action(model, act.REPLAY_BACKWARD)

        return before, after

    def api_before(mb: int) -> None:
        scopes.append(controller.microbatch(mb))
        scopes.append(scopes[-1].__enter__())

    def api_after(mb: int, output: Any) -> None:
        handle, scope = scopes.pop(), scopes.pop()
        handle.track(output)
        scope.__exit__(None, None, None)

    def run_off() -> list[float]:
        return step(models["off"], batches, lambda mb: None, lambda mb, out: None)

    def run_engine(api: Any, side: str) -> Callable[[], list[float]]:
        before, after = engine(api, side)

        def go() -> list[float]:
            api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.REPLAY_FORWARD)
            losses = step(models[side], batches, before, after)
            api.RouterReplay.clear_global_indices()
            api.RouterReplay.clear_global_router_replay_action()
            return losses

        return go

    def run_api() -> list[float]:
        controller.set_mode(ReplayMode.REPLAY)
        for mb, (rows, mask) in enumerate(packed):
            controller.arm(mb, rows, layer_numbers=controller.layer_numbers, replay_mask_T=mask)
        losses = step(models["rr_api"], batches, api_before, api_after)
        controller.end_step()
        return losses

    # native routes (recorded by rr's API, untimed) as the rollout would return them: a
    # replayed step then routes exactly as the unreplayed one, so only replay's own work differs
    controller.set_mode(ReplayMode.RECORD)
    step(models["rr_api"], batches, api_before, api_after)
    native = []
    for mb in range(len(batches)):
        rows = controller.recorded(mb).to(torch.int16)
        native.append(jagged([seq[:-1] for seq in rows.split(lengths)]))
    controller.end_step()
    use(native)

    runs = {
        "off": run_off,
        "verl": run_engine(verl, "verl"),
        "rr_dropin": run_engine(rv, "rr_dropin"),
        "rr_api": run_api,
    }
    samples, losses = Samples(), {}
    for i in range(args.step_rounds + 1):
        for side, fn in runs.items():
            gc.collect()
            start = now()
            losses[side] = fn()
            span = since(start)
            if i:
                samples.add(side, span)
    check_losses(losses, same_as_off=True)
    # replay takes effect on each side: random (non-native) targets, untimed
    use(
        [
            rollout_routes(lengths, shape.layers, shape.experts, shape.topk, 20 + mb)
            for mb in range(len(batches))
        ]
    )
    check_losses({side: fn() for side, fn in runs.items()}, same_as_off=False)
    controller.detach()
    return samples.report(list(runs), "off")


def check_losses(losses: Mapping[str, list[float]], *, same_as_off: bool) -> None:
    def close(a: list[float], b: list[float]) -> bool:
        return all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True))

    replayed = [losses[s] for s in ("verl", "rr_dropin", "rr_api")]
    if not all(close(replayed[0], other) for other in replayed[1:]):
        raise AssertionError(f"replayed losses differ: {dict(losses)}")
    if close(replayed[0], losses["off"]) != same_as_off:
        what = "differ from" if same_as_off else "equal"
        raise AssertionError(f"replayed losses {what} the unreplayed ones: {dict(losses)}")
