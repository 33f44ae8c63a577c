"""rr-core benchmarks, measured side by side in one process (ratios, not absolute times).

1. ``replay_topk`` against native top-k on a Qwen3-30B-A3B-sized router: 4096 tokens x 128
   experts, top-8, float32 scores.
2. Per-micro-batch bookkeeping of the controller on a 94-layer model (Qwen3-235B-A22B depth):
   arming one micro-batch's targets and ending the step (the walk is done once at attach).
3. Per-router-call dispatch overhead of the hook on tiny scores (Python cost only).

Usage: ``python bench_core.py [--json] [--threads N]``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn
from torch.utils.benchmark import Timer

from rr_core import ReplayController, ReplayMode, native_topk, replay_topk, router_topk

TOKENS, EXPERTS, TOP_K, LAYERS = 4096, 128, 8, 94


def median_us(stmt: str, env: dict[str, Any], min_run_time: float = 1.0) -> float:
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)


def random_targets(tokens: int, layers: int, g: torch.Generator) -> torch.Tensor:
    """``[tokens, layers, TOP_K]`` distinct ids per row (uint8), vectorised."""
    keys = torch.rand(tokens * layers, EXPERTS, generator=g)
    ids = keys.topk(TOP_K, dim=-1).indices
    return ids.reshape(tokens, layers, TOP_K).to(torch.uint8)


def bench_topk() -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    scores = torch.softmax(torch.randn(TOKENS, EXPERTS, generator=g), dim=-1)
    targets = random_targets(TOKENS, 1, g)[:, 0]
    mask = torch.ones(TOKENS, dtype=torch.bool)
    mask[-1] = False  # R3: the last token has no route
    env = {
        "scores": scores,
        "targets": targets,
        "mask": mask,
        "native_topk": native_topk,
        "replay_topk": replay_topk,
    }
    native = median_us("native_topk(scores, 8)", env)
    full = median_us("replay_topk(scores, 8, target_ids_TK=targets)", env)
    masked = median_us("replay_topk(scores, 8, target_ids_TK=targets, replay_mask_T=mask)", env)
    return {
        "native_topk_us": native,
        "replay_topk_us": full,
        "replay_topk_masked_us": masked,
        "replay_topk_over_native": full / native,
        "replay_topk_masked_over_native": masked / native,
    }


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    figures = {**bench_topk(), **bench_bookkeeping(), **bench_dispatch()}
    figures["torch_threads"] = torch.get_num_threads()
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    workloads = {
        "native_topk_us": f"{TOKENS} tokens x {EXPERTS} experts, top-{TOP_K}, float32",
        "replay_topk_us": "same, every row replayed",
        "replay_topk_masked_us": "same, replay mask (last row native)",
        "attach_walk_us_94_layers": f"walk + attach, {LAYERS} routers (once per model)",
        "bookkeeping_us_per_microbatch_94_layers": "arm (trusted) + end_step, per micro-batch",
        "arm_validated_us_per_microbatch_94_layers": f"arm with id checks, [{TOKENS},{LAYERS},8]",
        "hook_replay_us_tiny_scores": "one router call in REPLAY, 4 tokens",
    }
    for key, value in figures.items():
        print(f"{key:<45} {value:>12.3f}  {workloads.get(key, '')}")


if __name__ == "__main__":
    main()
