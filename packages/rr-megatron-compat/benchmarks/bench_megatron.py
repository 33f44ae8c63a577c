"""Training-step time of a real GPTModel on CPU with R3 replay on vs off, side by side.

Same model, same micro-batches, alternating rounds (off, on, off, on, ...) so drift hits both
equally; reports the median step time of each and ``step_overhead_ratio_r3`` = on / off - 1.
"Off" is a model with rr installed but no controller attached (Megatron's code untouched).

    python packages/rr-megatron-compat/benchmarks/bench_megatron.py [--json] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
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
            controller = ReplayController(num_experts=8, top_k=2, measure_agreement=False)
            rmc.attach(controller, model)
            controller.set_mode(ReplayMode.RECORD)
            train_step([model], batches[:1])
            routes = controller.recorded(0)
            controller.end_step()
            controller.detach()
            off: list[float] = []
            on: list[float] = []
            for i in range(rounds + 1):
                start = time.perf_counter()
                train_step([model], batches)
                t_off = time.perf_counter() - start
                rmc.attach(controller, model)
                controller.set_mode(ReplayMode.REPLAY)
                controller.arm(0, routes, layer_numbers=controller.layer_numbers)
                start = time.perf_counter()
                train_step([model], batches)
                controller.end_step()
                t_on = time.perf_counter() - start
                controller.detach()
                if i:  # the first round warms up
                    off.append(t_off)
                    on.append(t_on)
        finally:
            rmc.uninstall()
    off_s, on_s = statistics.median(off), statistics.median(on)
    return {
        "megatron_core": str(rmc.megatron_line().version),
        "rounds": rounds,
        "hidden_size": hidden,
        "seq_length": seq,
        "sequences": microbatches,
        "step_s_replay_off": off_s,
        "step_s_replay_r3": on_s,
        "step_overhead_ratio_r3": on_s / off_s - 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=2, help="sequences per step")
    args = parser.parse_args()
    result = run(args.rounds, args.hidden, args.seq, args.microbatches)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:24} {value:.4f}" if isinstance(value, float) else f"{key:24} {value}")


if __name__ == "__main__":
    main()
