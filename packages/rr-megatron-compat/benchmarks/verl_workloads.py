"""bench_verl's per-micro-batch workloads: the engine's R3 bookkeeping around one replayed
micro-batch and the R2 record merge."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from verl_measure import Samples, Span, now, since
from verl_models import Marks, lengths_of, rollout_routes, routers_forward, token_ids

# -- workload 1: per-micro-batch bookkeeping ---------------------------------------------------


def bookkeeping(
    api: Any, model: nn.Module, tc: Any, routes: Any, mask: Any, marks: Marks, hidden: torch.Tensor
) -> Span:
    """The engine's bookkeeping around one replayed micro-batch (the forward itself excluded)."""
    act = api.RouterReplayAction
    helper = api.RouterReplayHelper
    start = now()
    if helper.is_replay_backward_action(tc, 0, model=model):
        api.set_model_router_replay_action(model, act.REPLAY_FORWARD)
    if helper.is_replay_forward_action(tc, 0, model=model):
        api.set_router_replay_data(routes, None, tc, 0, replay_mask=mask, model=model)
    marks.clear()
    model(hidden)
    forward_start, forward_end = marks
    post = now()
    if helper.is_replay_forward_action(tc, 0, model=model):
        api.set_model_router_replay_action(model, act.REPLAY_BACKWARD)
    total = Span(forward_start.cpu - start.cpu, forward_start.wall - start.wall)
    total += since(post)
    total += Span(post.cpu - forward_end.cpu, post.wall - forward_end.wall)
    return total


def run_bookkeeping(
    sides: Mapping[str, Any], models: Mapping[str, nn.Module], args: argparse.Namespace
) -> dict[str, Any]:
    lengths = lengths_of(args.tokens, args.sequences)
    input_ids = token_ids(lengths, 64, seed=1)
    response = torch.ones(len(lengths), 16, dtype=torch.int64)
    micro = [
        rollout_routes(lengths, args.layers, args.experts, args.topk, seed=10 + i) for i in (0, 1)
    ]
    hidden = torch.randn(args.tokens, 1, args.hidden, generator=torch.Generator().manual_seed(2))
    marks: dict[str, Marks] = {}
    for side, model in models.items():
        marks[side] = []
        routers_forward(model, hidden, marks[side])
    book, prep, end = Samples(), Samples(), Samples()
    aligned: dict[str, tuple[Any, Any]] = {}
    for i in range(args.rounds + 1):
        for side, api in sides.items():
            model, tc = models[side], models[side].config
            start = now()
            routes = api.align_r3_router_replay_data(micro[0], input_ids)
            mask = api.build_r3_replay_mask(input_ids, response)
            span = since(start)
            if i:
                prep.add(side, span)
            aligned[side] = routes, mask
            api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.REPLAY_FORWARD)
            for mb in (0, 1):
                routes = (
                    aligned[side][0]
                    if mb == 0
                    else api.align_r3_router_replay_data(micro[1], input_ids)
                )
                span = bookkeeping(api, model, tc, routes, mask, marks[side], hidden)
                if i:
                    book.add(side, span)
            start = now()
            api.RouterReplay.clear_global_indices()
            api.RouterReplay.clear_global_router_replay_action()
            span = since(start)
            if i:
                end.add(side, span)
    check_aligned(aligned)
    names = list(sides)
    return {
        "bookkeeping_per_microbatch": book.report(names, "verl"),
        "r3_prep_per_microbatch": prep.report(names, "verl"),
        "end_of_step": end.report(names, "verl"),
    }


def check_aligned(aligned: Mapping[str, tuple[Any, Any]]) -> None:
    (routes_a, mask_a), (routes_b, mask_b) = aligned.values()
    if not (
        torch.equal(routes_a.values(), routes_b.values())
        and torch.equal(mask_a.values(), mask_b.values())
    ):
        raise AssertionError("verl and rr aligned the R3 routes or built the mask differently")


# -- workload 2: R2 record merge ---------------------------------------------------------------


def run_merge(
    sides: Mapping[str, Any],
    models: Mapping[int, Mapping[str, nn.Module]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    lengths = lengths_of(args.tokens, args.sequences)
    input_ids = token_ids(lengths, 64, seed=3)
    hidden = torch.randn(args.tokens, 1, args.hidden, generator=torch.Generator().manual_seed(4))
    out: dict[str, Any] = {}
    for layers, pair in models.items():
        marks: Marks = []
        for model in pair.values():
            routers_forward(model, hidden, marks)
        samples = Samples()
        merged: dict[str, torch.Tensor] = {}
        for i in range(args.rounds + 1):
            for side, api in sides.items():
                model, tc = pair[side], pair[side].config
                helper = api.RouterReplayHelper
                # compute_log_prob as the engine runs it: queries, forward, merge, query
                api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.RECORD)
                helper.is_replay_backward_action(tc, 0, model=model)
                helper.is_replay_forward_action(tc, 0, model=model)
                with torch.no_grad():
                    model(hidden)
                result: list[torch.Tensor] = []
                start = now()
                api.merge_router_topk_indices(None, input_ids, result, tc, 0, model=model)
                span = since(start)
                helper.is_replay_forward_action(tc, 0, model=model)
                api.RouterReplay.clear_global_indices()
                api.RouterReplay.clear_global_router_replay_action()
                if i:
                    samples.add(side, span)
                merged[side] = result[0]
        a, b = (m.values().sort(dim=-1).values for m in merged.values())
        if a.shape != (args.tokens, layers, args.topk) or not torch.equal(a, b):
            raise AssertionError(f"{layers} layers: verl and rr merged different routes")
        out[f"layers_{layers}"] = samples.report(list(sides), "verl")
    first, last = min(models), max(models)
    for side in sides:
        for what in ("cpu", "wall"):
            key = f"{side}_{what}_ms"
            ratio = out[f"layers_{last}"][key] / out[f"layers_{first}"][key]
            out[f"{side}_{what}_growth_{first}_to_{last}_layers"] = round(ratio, 2)
    return out
