"""verl's FSDP engine step with rr's replay over the same step without it, side by side in one
process: one engine (FSDP2, one gloo rank, verl's own forward_backward_batch, gradient
checkpointing), the same batch, rounds alternated (native, R3, native, R3, ...; the first pair
warms up); figures are medians of wall time, the ratio is replay / native.

    python packages/rr-transformers/benchmarks/bench_verl_fsdp.py [--rounds N] [--family F]

Needs verl 0.9.1 and transformers (the ``verl`` nox venv has both). Both variants run the update
step (forward, backward with the checkpoint recompute, optimizer step): native with
``enable_routing_replay=False`` in the batch (verl's reference-model marking), R3 with the
batch's random rollout routes replayed in every MoE layer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rr_transformers
import rr_transformers.verl as rr_verl
from rr_fakes import distinct_ids
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, VOCAB
from rr_fakes.shims.verl._batch import run_step, verl_batch
from rr_fakes.shims.verl._fsdp import fsdp_cpu, fsdp_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--family", default="qwen3_moe")
    parser.add_argument("--sequences", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = [16 + 3 * b for b in range(args.sequences)]
    responses = [24 + 5 * (b % 3) for b in range(args.sequences)]
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    with fsdp_cpu():
        rr_verl.install()
        engine = fsdp_engine(args.family, mode="R3")
        slots = len(engine.module.get_decoder().layers)
        dense = [
            i
            for i, layer in enumerate(engine.module.get_decoder().layers)
            if not any(type(m).__name__.lower().endswith("router") for m in layer.modules())
        ]
        routes = []
        for b, n in enumerate(lengths):
            ids = distinct_ids(n - 1, slots, num_experts=NUM_EXPERTS, top_k=TOP_K, seed=b)
            ids[:, dense] = 0
            routes.append(ids)

        def batch(replay: bool) -> object:
            return verl_batch(
                prompts,
                responses,
                VOCAB,
                routed_experts=routes,
                enable_routing_replay=replay,
                micro_batch_size=2,
            )

        times: dict[str, list[float]] = {"native": [], "R3": []}
        with engine.train_mode():
            for round_ in range(args.rounds + 1):
                for name in ("native", "R3") if round_ % 2 else ("R3", "native"):
                    data = batch(name == "R3")
                    start = time.perf_counter()
                    run_step(engine, data, forward_only=False)
                    engine.optimizer_step()
                    engine.optimizer_zero_grad()
                    if round_:
                        times[name].append(time.perf_counter() - start)
        rr_verl.detach(rr_verl.controller_of(engine.module))
        rr_verl.uninstall()
        rr_transformers.uninstall()
    native, replay = (statistics.median(times[k]) for k in ("native", "R3"))
    tokens = sum(lengths)
    print(
        f"{args.family}: {args.sequences} sequences, {tokens} tokens, 4 micro-batches, "
        f"{args.rounds} rounds"
    )
    print(
        f"native step {native * 1e3:.1f} ms, R3 replay step {replay * 1e3:.1f} ms, "
        f"ratio {replay / native:.3f}"
    )


if __name__ == "__main__":
    main()
