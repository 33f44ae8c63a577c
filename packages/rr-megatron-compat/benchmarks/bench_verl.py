"""verl 0.9.1's router-replay functions against rr's drop-in (``rr_megatron_compat.verl``), side
by side in one process on the same inputs; figures are medians, ratios are rr / verl.

    python packages/rr-megatron-compat/benchmarks/bench_verl.py [--json] [--rounds N]

Needs verl 0.9.1 importable (``pip install verl==0.9.1 --no-deps`` plus its import-time needs)
next to megatron-core 0.16+. Three workloads, each timed with thread CPU time and wall time in
alternating rounds (verl, rr, verl, rr, ...; the first round of each warms up):

1. ``bookkeeping``: what verl's engine (``MegatronEngine.forward_step``) does around one R3
   micro-batch: ``is_replay_backward_action`` -> ``set_model_router_replay_action(REPLAY_FORWARD)``
   when true, ``is_replay_forward_action``, ``set_router_replay_data`` (jagged int16 routes, the R3
   replay mask, ``model=``), then the model call up to the first line of its forward (so every
   forward pre-hook runs: rr arms and validates the staged targets there), and from the last
   line of its forward through the return of the call (forward hooks: rr tracks the output),
   ``is_replay_forward_action`` -> ``set_model_router_replay_action(REPLAY_BACKWARD)``. Two
   micro-batches a round (the second takes the backward -> forward switch); the forward in
   between runs every decoder router on fixed hidden states (so the staged targets are really
   consumed) and is not timed. ``r3_prep`` times ``align_r3_router_replay_data`` +
   ``build_r3_replay_mask`` of one micro-batch, ``end_of_step`` the engine's
   ``clear_global_indices(); clear_global_router_replay_action()``.
2. ``merge``: ``merge_router_topk_indices`` (jagged ``input_ids``, ``model=``) after a RECORD
   forward (routers only, not timed) in which each side's routers recorded the same routes, at
   ``layers`` / 4, / 2 and x1 layers; the merged routes are checked equal.
3. ``step``: a Megatron training step (forward, backward with full activation recompute,
   several micro-batches through Megatron's schedule) with no replay, with verl's replay, with
   rr's drop-in and with rr's own API (``ReplayController`` + ``rr_megatron_compat.attach``), all
   replaying the same random (non-native) R3 targets; the replayed losses are checked equal
   to each other and different from the unreplayed ones.

Both stacks coexist in one process: verl's ``apply_router_replay_patch`` runs once; its patched
``TopKRouter.__init__`` is put back on the class only while verl's models are built, and its
patched ``TopKRouter.routing`` and alltoall ``preprocess`` are bound on the instances of verl's
models, so the classes keep Megatron's code (under rr's hooks) for rr's models.

Megatron's local (non Transformer Engine) layer spec builds ``SequentialMLP`` experts on CPU:
``moe_grouped_gemm`` stays False. With ``--expert-tree grouped`` (default) each layer's experts
show the module tree of a grouped GEMM (one experts module with ``linear_fc1`` / ``linear_fc2``
children, as ``TEGroupedMLP``) and compute with the ``SequentialMLP`` they hide: both stacks
walk the model's modules, and 128 sequential experts make the decoder's tree about 23 times
larger (some 19 000 modules instead of 819 at 48 layers). ``--expert-tree sequential`` keeps
Megatron's tree as built.

Every torch call goes through the CPU harness (``rr_fakes.shims.megatron.megatron_cpu``) on both
sides alike. Beside this script: ``verl_measure`` (the clock), ``verl_models`` (both stacks,
their models and inputs), ``verl_workloads`` (workloads 1 and 2) and ``verl_step`` (workload 3).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from verl_models import Shape, Verl, build
from verl_step import run_step
from verl_workloads import run_bookkeeping, run_merge

import rr_megatron_compat as rmc
import rr_megatron_compat.verl as rv
from rr_fakes.shims.megatron import model_parallel

# -- driver ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr), model_parallel():
        verl = Verl()
        rv.apply_router_replay_patch()
        try:
            sides = {"verl": verl, "rr": rv}
            shape = Shape(args.layers, args.experts, args.topk, args.hidden, args.tokens)
            big = {
                "verl": build(shape, verl, args.expert_tree),
                "rr": build(shape, None, args.expert_tree),
            }
            modules = sum(1 for _ in big["rr"].decoder.modules())
            w1 = run_bookkeeping(sides, big, args)
            sizes = sorted({max(1, args.layers // 4), max(1, args.layers // 2)} - {args.layers})
            pairs: dict[int, dict[str, nn.Module]] = {}
            for layers in sizes:
                small = Shape(layers, args.experts, args.topk, args.hidden, args.tokens)
                pairs[layers] = {
                    "verl": build(small, verl, args.expert_tree),
                    "rr": build(small, None, args.expert_tree),
                }
            pairs[args.layers] = big
            w2 = run_merge(sides, pairs, args)
            # the step starts from fresh registries, as an engine with one model has
            del big, pairs
            rv.remove_router_replay_patch()
            verl.RouterReplay.router_instances.clear()
            gc.collect()
            rv.apply_router_replay_patch()
            w3 = run_step(verl, args) if args.step_rounds else {}
        finally:
            rv.remove_router_replay_patch()
    return {
        "verl": importlib.import_module("verl").__version__,
        "megatron_core": str(rmc.megatron_line().version),
        "torch_threads": args.threads,
        "rounds": args.rounds,
        "layers": args.layers,
        "tokens": args.tokens,
        "sequences": args.sequences,
        "experts": args.experts,
        "topk": args.topk,
        "expert_tree": args.expert_tree,
        "decoder_modules": modules,
        "moe_grouped_gemm": False,
        "bookkeeping": w1,
        "merge": w2,
        "step": {
            "layers": args.step_layers,
            "tokens_per_microbatch": args.step_tokens,
            "microbatches": args.step_microbatches,
            "rounds": args.step_rounds,
            "recompute": "full",
            **w3,
        },
        "runtime_s": round(time.perf_counter() - began, 1),
    }


def table(result: Mapping[str, Any]) -> str:
    lines = [
        f"verl {result['verl']} vs rr, megatron-core {result['megatron_core']}, "
        f"{result['layers']} layers x {result['tokens']} tokens, top-{result['topk']} of "
        f"{result['experts']}, {result['expert_tree']} expert tree, "
        f"{result['torch_threads']} thread(s); medians in ms, ratios rr / verl",
        f"{'figure':34} {'verl cpu':>9} {'rr cpu':>9} {'cpu x':>6} {'wall x':>6}",
    ]

    def row(name: str, figure: Mapping[str, Any], a: str = "verl", b: str = "rr") -> None:
        lines.append(
            f"{name:34} {figure[f'{a}_cpu_ms']:9.3f} {figure[f'{b}_cpu_ms']:9.3f} "
            f"{figure[f'{b}_over_{a}_cpu']:6.2f} {figure[f'{b}_over_{a}_wall']:6.2f}"
        )

    w1 = result["bookkeeping"]
    row("bookkeeping / micro-batch", w1["bookkeeping_per_microbatch"])
    row("R3 align + mask / micro-batch", w1["r3_prep_per_microbatch"])
    row("end of step (clear)", w1["end_of_step"])
    for key, figure in result["merge"].items():
        if key.startswith("layers_"):
            row(f"R2 merge, {key.split('_')[1]} layers", figure)
    step = result["step"]
    if "off_cpu_ms" in step:
        lines.append(
            f"training step ({step['layers']} layers, {step['microbatches']} x "
            f"{step['tokens_per_microbatch']} tokens, recompute): "
            f"off {step['off_cpu_ms']:.1f} ms cpu"
        )
        for side in ("verl", "rr_dropin", "rr_api"):
            lines.append(
                f"  {side:10} / off   cpu {step[f'{side}_over_off_cpu']:.3f}   "
                f"wall {step[f'{side}_over_off_wall']:.3f}"
            )
    lines.append(f"runtime {result['runtime_s']} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--sequences", type=int, default=4, help="sequences per micro-batch")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--expert-tree", choices=("grouped", "sequential"), default="grouped")
    parser.add_argument("--step-rounds", type=int, default=4, help="0 skips the step workload")
    parser.add_argument("--step-layers", type=int, default=4)
    parser.add_argument("--step-tokens", type=int, default=256)
    parser.add_argument("--step-microbatches", type=int, default=4)
    parser.add_argument("--step-hidden", type=int, default=16)
    args = parser.parse_args()
    if importlib.util.find_spec("verl") is None:
        raise SystemExit("bench_verl needs verl 0.9.1: pip install verl==0.9.1 --no-deps (+ deps)")
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
