"""rr-transformers benchmarks on CPU, measured side by side in one process (ratios first).

1. Training step of a real transformers Qwen3-MoE model (forward + backward + AdamW step) in
   five variants, alternated round by round, each round in a fresh shuffled order (seeded)
   so neither drift nor the variant run just before favours one:
   ``bare`` (rr not installed: transformers' own code), ``off`` (rr installed, a controller
   attached, mode OFF: every router call goes through rr's proxy and routes natively) and ``r3``
   (R3 replay: an rr_vllm-style RouteBatch with T-1 rows per sequence armed with
   ``arm_routes`` each step, ``end_step`` after; the armed routes are the model's own, and the
   learning rate is 0, so every variant computes the same expert loads; the optimizer's
   arithmetic still runs; the agreement is reported, by the controller's default threshold
   test on the router's scores). ``r3_exact`` measures the agreement with a second native
   top-k beside every replayed one, ``r3_no_agreement`` not at all. Step times are process
   CPU time (what other load on a shared machine disturbs least; the wall medians are
   reported too; on an accelerator, wall time after a synchronize). Reports the median step
   of each and ``step_overhead_ratio_r3`` = r3 / bare
   (``r3_over_off``: r3 / off). Because a step's spread on a busy machine exceeds the
   overhead, ``parts_us`` also measures what rr adds alone (one router call, forward and
   backward, per variant; ``arm_routes`` and ``end_step`` for the micro-batch) and
   ``attributed_overhead_ratio`` adds it up per step (layers x router cost + arm + end).
2. Per-micro-batch bookkeeping on a 94-layer model (Qwen3-235B-A22B depth, E=128, top-8,
   4096 router rows as 16 right-padded sequences of 256 tokens, T-1 route rows each):
   ``arm_routes`` (index the batch's rows in the routers' row order, then arm) + ``end_step``,
   no forward; beside it the batch laid out row by row first, then armed (how it was done
   before); the same with rows already laid out is what bench_core reports for Megatron.

3. The attach-time probe (:mod:`rr_transformers._probe`) per family, on the tiny models the
   tests build (E=8, top-2, hidden 32): ``attach`` + ``detach`` with the probe and with it
   replaced by a no-op, alternated round by round; the difference over the routers attached is
   the probe's cost per router (``probe_us_per_router``; process CPU time, medians).

Usage: ``python bench_transformers.py [--json] [--rounds N] [--threads N] [--only step]
[--device cuda]``. Beside this script: ``transformers_measure`` (the clock),
``transformers_step`` (1) and ``transformers_overheads`` (2 and 3).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
from transformers_measure import DEVICE
from transformers_overheads import bench_bookkeeping, bench_probe
from transformers_step import bench_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds of the step")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--only", choices=("step", "bookkeeping", "probe"), help="run one benchmark"
    )
    parser.add_argument("--device", default="cpu", help="where the step runs: cpu, cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    DEVICE[0] = torch.device(args.device)
    benches: dict[str, Callable[[], dict[str, Any]]] = {
        "step": lambda: bench_step(args.rounds),
        "bookkeeping": bench_bookkeeping,
        "probe": bench_probe,
    }
    figures: dict[str, Any] = {}
    for name, bench in benches.items():
        if args.only in (None, name):
            figures.update(bench())
    figures["torch_threads"] = torch.get_num_threads()
    figures["device"] = str(DEVICE[0])
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key:<48} {value:.4f}" if isinstance(value, float) else f"{key:<48} {value}")


if __name__ == "__main__":
    main()
