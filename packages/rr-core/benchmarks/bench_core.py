"""rr-core benchmarks, measured side by side in one process (ratios, not absolute times).

1. ``replay_topk`` against native top-k on a Qwen3-30B-A3B-sized router: 4096 tokens x 128
   experts, top-8, float32 scores; every row replayed, and with an R3 replay mask (the last
   token native), beside the mask applied after a full native top-k (how it was done before).
2. One router call through the controller in R3 (replay mask, last row native) with the
   agreement measured by the threshold test (the default), by a second top-k ("exact"), or
   not at all, over the native top-k of the same scores.
3. Per-micro-batch bookkeeping of the controller on a 94-layer model (Qwen3-235B-A22B depth):
   arming one micro-batch's targets and ending the step (the walk is done once at attach).
4. Per-router-call dispatch overhead of the hook on tiny scores (Python cost only).

Usage: ``python bench_core.py [--json] [--threads N] [--device cuda]`` (1 and 2 run on the
device; the bookkeeping and dispatch figures are host-side).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from torch import nn
from torch.utils.benchmark import Timer

from rr_core import ReplayController, ReplayMode, native_topk, replay_topk, router_topk
from rr_core.replay.topk import native_ids

TOKENS, EXPERTS, TOP_K, LAYERS = 4096, 128, 8, 94


def median_us(stmt: str, env: dict[str, Any], min_run_time: float = 1.0) -> float:
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)


def random_targets(tokens: int, layers: int, g: torch.Generator) -> torch.Tensor:
    """``[tokens, layers, TOP_K]`` distinct ids per row (uint8), vectorised."""
    keys = torch.rand(tokens * layers, EXPERTS, generator=g)
    ids = keys.topk(TOP_K, dim=-1).indices
    return ids.reshape(tokens, layers, TOP_K).to(torch.uint8)


def r3_inputs(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router scores, one layer's replay targets and the R3 mask (last token native)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.softmax(torch.randn(TOKENS, EXPERTS, generator=g), dim=-1)
    targets = random_targets(TOKENS, 1, g)[:, 0]
    mask = torch.ones(TOKENS, dtype=torch.bool)
    mask[-1] = False  # R3: the last token has no route
    return scores.to(device), targets.to(device), mask.to(device)


def bench_topk(device: str) -> dict[str, float]:
    scores, targets, mask = r3_inputs(device)
    env = {
        "scores": scores,
        "targets": targets,
        "mask": mask,
        "native_topk": native_topk,
        "native_ids": native_ids,
        "replay_topk": replay_topk,
    }
    native = median_us("native_topk(scores, 8)", env)
    full = median_us("replay_topk(scores, 8, target_ids_TK=targets)", env)
    masked = median_us("replay_topk(scores, 8, target_ids_TK=targets, replay_mask_T=mask)", env)
    where = median_us(  # the mask applied after a full top-k
        "replay_topk(scores, 8, target_ids_TK=targets, replay_mask_T=mask, "
        "native_ids_TK=native_ids(scores, 8))",
        env,
    )
    return {
        "native_topk_us": native,
        "replay_topk_us": full,
        "replay_topk_masked_us": masked,
        "replay_topk_masked_full_topk_us": where,
        "replay_topk_over_native": full / native,
        "replay_topk_masked_over_native": masked / native,
        "replay_topk_masked_full_topk_over_native": where / native,
    }


def bench_agreement(device: str, rounds: int = 7) -> dict[str, float]:
    """One R3 router call through the controller per agreement setting, over native top-k;
    the settings alternate round by round (a load spike on a shared machine hits one round of
    each, not one setting), medians of the rounds."""
    scores, targets, mask = r3_inputs(device)
    router = _Router(1)
    model = nn.ModuleList([router])
    env: dict[str, Any] = {"router": router, "scores": scores, "router_topk": router_topk}
    settings: dict[str, bool | str | None] = {
        "native": None,  # not attached: the native top-k
        "threshold": True,
        "exact": "exact",
        "off": False,
    }
    samples: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, measure in settings.items():
            if measure is None:
                samples[name].append(median_us("router_topk(router, scores, 8)", env, 0.2))
                continue
            ctrl = ReplayController(num_experts=EXPERTS, top_k=TOP_K, measure_agreement=measure)
            ctrl.attach(model)
            ctrl.set_mode(ReplayMode.REPLAY)
            ctrl.arm(0, targets[:, None], layer_numbers=[1], replay_mask_T=mask)
            samples[name].append(median_us("router_topk(router, scores, 8)", env, 0.2))
            ctrl.release(0)
            ctrl.detach()
    us = {name: statistics.median(values) for name, values in samples.items()}
    figures = {"agreement_native_topk_us": us["native"]}
    for name in ("threshold", "exact", "off"):
        figures[f"r3_call_agreement_{name}_us"] = us[name]
        figures[f"r3_call_agreement_{name}_over_native"] = us[name] / us["native"]
    return figures


class _Router(nn.Module):
    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number


def bench_bookkeeping() -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    model = nn.ModuleList(_Router(i + 1) for i in range(LAYERS))
    ctrl = ReplayController(num_experts=EXPERTS, top_k=TOP_K)
    env: dict[str, Any] = {"ctrl": ctrl, "model": model}
    attach = median_us("ctrl.attach(model)", env, min_run_time=0.5)
    ctrl.set_mode(ReplayMode.REPLAY)
    layers = ctrl.layer_numbers
    routes = random_targets(TOKENS, LAYERS, g)
    env.update(routes=routes, layers=layers, ReplayMode=ReplayMode)

    def cycle(validate: bool) -> float:
        stmt = f"ctrl.arm(0, routes, layer_numbers=layers, validate={validate}); ctrl.release(0)"
        return median_us(stmt, env)

    arm_trusted = cycle(False)
    arm_validated = cycle(True)
    step_end = median_us("ctrl.end_step()", env)
    ctrl.detach()
    return {
        "attach_walk_us_94_layers": attach,
        "bookkeeping_us_per_microbatch_94_layers": arm_trusted + step_end,
        "arm_validated_us_per_microbatch_94_layers": arm_validated,
        "end_step_us": step_end,
    }


def bench_dispatch() -> dict[str, float]:
    router = _Router(1)
    model = nn.ModuleList([router])
    scores = torch.softmax(torch.randn(4, EXPERTS), dim=-1)
    ctrl = ReplayController(num_experts=EXPERTS, top_k=TOP_K, measure_agreement=False)
    env: dict[str, Any] = {"router": router, "scores": scores, "router_topk": router_topk}
    unattached = median_us("router_topk(router, scores, 8)", env)
    ctrl.attach(model)
    ctrl.set_mode(ReplayMode.REPLAY)
    ctrl.arm(0, random_targets(4, 1, torch.Generator().manual_seed(2)), layer_numbers=[1])
    replaying = median_us("router_topk(router, scores, 8)", env)
    ctrl.release(0)
    ctrl.detach()
    return {"hook_unattached_us": unattached, "hook_replay_us_tiny_scores": replaying}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="where the top-k figures run: cpu, cuda")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    figures: dict[str, Any] = {
        **bench_topk(args.device),
        **bench_agreement(args.device),
        **bench_bookkeeping(),
        **bench_dispatch(),
    }
    figures["torch_threads"] = torch.get_num_threads()
    figures["device"] = str(torch.device(args.device))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    workloads = {
        "native_topk_us": f"{TOKENS} tokens x {EXPERTS} experts, top-{TOP_K}, float32",
        "replay_topk_us": "same, every row replayed",
        "replay_topk_masked_us": "same, replay mask (last row native)",
        "replay_topk_masked_full_topk_us": "same, mask applied after a full native top-k",
        "r3_call_agreement_threshold_us": "R3 router call, agreement by threshold test",
        "r3_call_agreement_exact_us": "R3 router call, agreement by a second top-k",
        "r3_call_agreement_off_us": "R3 router call, no agreement",
        "attach_walk_us_94_layers": f"walk + attach, {LAYERS} routers (once per model)",
        "bookkeeping_us_per_microbatch_94_layers": "arm (trusted) + end_step, per micro-batch",
        "arm_validated_us_per_microbatch_94_layers": f"arm with id checks, [{TOKENS},{LAYERS},8]",
        "hook_replay_us_tiny_scores": "one router call in REPLAY, 4 tokens",
    }
    for key, value in figures.items():
        shown = f"{value:>12.3f}" if isinstance(value, float) else f"{value!s:>12}"
        print(f"{key:<45} {shown}  {workloads.get(key, '')}")


if __name__ == "__main__":
    main()
