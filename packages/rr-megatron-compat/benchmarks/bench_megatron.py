"""Training-step time of a real GPTModel on CPU with R3 replay on vs off, side by side.

Same model, same micro-batches, variants alternated round by round, each round in a fresh
shuffled order (seeded) so neither drift nor the variant run just before favours one; reports
the median step time of each. "Off" is a model with rr installed but no controller attached
(Megatron's code untouched); "r3" arms the recorded routes with R3's replay mask (the last
token of each sequence routes natively) and reports the step's agreement (the controller's
default, a threshold test on the router's scores); "r3_exact" measures agreement with a
second native top-k; "r3_no_agreement" measures none. ``step_overhead_ratio_r3`` = r3 / off
- 1. The harness runs megatron-core on CPU only.

    python packages/rr-megatron-compat/benchmarks/bench_megatron.py [--json] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayMode
from rr_fakes.megatron import TinyGPTConfig, build_gpt, gpt_inputs, model_parallel, train_step


def run(rounds: int, hidden: int, seq: int, microbatches: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    with model_parallel():
        rmc.install()
        try:
            extra: dict[str, Any] = rmc.replay_config_fields()
            config = TinyGPTConfig(
                hidden_size=hidden,
                ffn_hidden_size=2 * hidden,
                num_attention_heads=4,
                max_sequence_length=seq,
                aux_loss_coeff=0.01,
                extra=extra,
            )
            model = build_gpt(config)
            batches = [gpt_inputs(microbatches, seq, 64)]  # one micro-batch (rr's default id)
            controller = ReplayController(num_experts=8, top_k=2)
            rmc.attach(controller, model)
            controller.set_mode(ReplayMode.RECORD)
            train_step([model], batches[:1])
            routes = controller.recorded(0)
            controller.end_step()
            controller.detach()
            # router rows are [S, B] (sequence-major): the last token of every sequence is
            # the last B rows, which R3 leaves native (the engine never routed it)
            mask = torch.ones(routes.shape[0], dtype=torch.bool)
            mask[-microbatches:] = False
            times: dict[str, list[float]] = {name: [] for name in VARIANTS}
            order = random.Random(0)
            for i in range(rounds + 1):
                for name in order.sample(VARIANTS, len(VARIANTS)):
                    elapsed = _timed_step(model, batches, routes, mask, name)
                    if i:  # the first round warms up
                        times[name].append(elapsed)
        finally:
            rmc.uninstall()
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    off_s, on_s = step_s["off"], step_s["r3"]
    return {
        "megatron_core": str(rmc.megatron_line().version),
        "rounds": rounds,
        "hidden_size": hidden,
        "seq_length": seq,
        "sequences": microbatches,
        "step_s_replay_off": off_s,
        "step_s_replay_r3": on_s,
        "step_s_replay_r3_exact": step_s["r3_exact"],
        "step_s_replay_r3_no_agreement": step_s["r3_no_agreement"],
        "step_overhead_ratio_r3": on_s / off_s - 1.0,
        "r3_over_off": on_s / off_s,
        "r3_exact_over_off": step_s["r3_exact"] / off_s,
        "r3_no_agreement_over_off": step_s["r3_no_agreement"] / off_s,
    }


VARIANTS = ("off", "r3", "r3_exact", "r3_no_agreement")
_AGREEMENT: dict[str, bool | str] = {"r3": True, "r3_exact": "exact", "r3_no_agreement": False}


def _timed_step(
    model: Any, batches: list[Any], routes: torch.Tensor, mask: torch.Tensor, name: str
) -> float:
    """One training step of variant ``name``, in seconds (arming and the step's end included)."""
    if name == "off":
        start = time.perf_counter()
        train_step([model], batches)
        return time.perf_counter() - start
    controller = ReplayController(num_experts=8, top_k=2, measure_agreement=_AGREEMENT[name])
    rmc.attach(controller, model)
    try:
        controller.set_mode(ReplayMode.REPLAY)
        start = time.perf_counter()
        controller.arm(0, routes, layer_numbers=controller.layer_numbers, replay_mask_T=mask)
        train_step([model], batches)
        report = controller.end_step()
        elapsed = time.perf_counter() - start
    finally:
        controller.detach()
    assert bool(report.agreement) == (name != "r3_no_agreement")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=2, help="sequences per step")
    parser.add_argument("--device", default="cpu", help="cpu only: the harness runs on CPU")
    args = parser.parse_args()
    if torch.device(args.device).type != "cpu":
        print(json.dumps({"skipped": f"the megatron-core harness runs on CPU, not {args.device}"}))
        return
    result = run(args.rounds, args.hidden, args.seq, args.microbatches)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:24} {value:.4f}" if isinstance(value, float) else f"{key:24} {value}")


if __name__ == "__main__":
    main()
