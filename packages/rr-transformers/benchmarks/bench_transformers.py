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
[--device cuda]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.benchmark import Timer

import rr_transformers
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta
from rr_fakes.hf_models import NUM_EXPERTS, TOP_K, tiny_model

#: The step's model and micro-batch (one step: ~0.3 s of CPU time on one thread).
STEP = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "sequences": 2,
    "seq_length": 256,
}
#: The bookkeeping workload (bench_core's: 4096 rows, 94 layers, E=128, top-8).
BOOK = {"layers": 94, "experts": 128, "top_k": 8, "sequences": 16, "seq_length": 256}


def _rollout_batch(
    recorded_BSLK: torch.Tensor, num_experts: int, top_k: int, num_layers: int
) -> RouteBatch:
    """Routes as rr_vllm hands them over: all-layers axis, T-1 rows per sequence (the last
    sampled token is never fed back)."""
    meta = RouteMeta(
        num_experts=num_experts,
        top_k=top_k,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, num_layers + 1)),
    )
    return RouteBatch.from_sequences([seq_SLK[:-1] for seq_SLK in recorded_BSLK], meta)


def _decoded_batch(
    recorded_BSLK: torch.Tensor, num_experts: int, top_k: int, num_layers: int
) -> RouteBatch:
    """The same routes as rr_vllm's decoders return them: T rows per sequence, the last one
    (never fed back) zero and invalid."""
    meta = RouteMeta(
        num_experts=num_experts,
        top_k=top_k,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, num_layers + 1)),
    )
    seqs, valid = [], []
    for seq_SLK in recorded_BSLK:
        rows_SLK = seq_SLK.clone()
        rows_SLK[-1] = 0
        seqs.append(rows_SLK)
        valid.append(torch.arange(seq_SLK.shape[0]) < seq_SLK.shape[0] - 1)
    return RouteBatch.from_sequences(seqs, meta, valid=valid)


@dataclass
class _Step:
    """The step's model, micro-batch and optimizer, and the routes R3 arms for it."""

    model: Any
    ids_BS: torch.Tensor
    mask_BS: torch.Tensor
    optimizer: torch.optim.Optimizer
    batch: RouteBatch

    def __call__(self) -> None:
        out = self.model(input_ids=self.ids_BS, attention_mask=self.mask_BS, labels=self.ids_BS)
        out.loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _sync() -> None:
    """Wait for the accelerator, so a step's time is its own (nothing on CPU)."""
    if DEVICE[0].type == "cuda":
        torch.cuda.synchronize()


def _clock() -> float:
    """Process CPU time on CPU (least disturbed by other load); wall time on an accelerator."""
    _sync()
    return time.process_time() if DEVICE[0].type == "cpu" else time.perf_counter()


#: Where the step and the router calls run (``--device``).
DEVICE = [torch.device("cpu")]


def _build_step() -> _Step:
    sizes: dict[str, Any] = {k: v for k, v in STEP.items() if k not in ("sequences", "seq_length")}
    model = tiny_model("qwen3_moe", seed=0, mlp_only_layers=[], intermediate_size=512, **sizes)
    E, K, L = STEP["num_experts"], STEP["num_experts_per_tok"], STEP["num_hidden_layers"]
    B, S = STEP["sequences"], STEP["seq_length"]
    g = torch.Generator().manual_seed(0)
    ids_BS = torch.randint(3, STEP["vocab_size"], (B, S), generator=g).to(DEVICE[0])
    mask_BS = torch.ones(B, S, dtype=torch.long, device=DEVICE[0])
    model.to(DEVICE[0])
    rr_transformers.install()
    recorder = ReplayController(num_experts=E, top_k=K)
    rr_transformers.attach(recorder, model)
    try:
        recorder.set_mode(ReplayMode.RECORD)
        with torch.no_grad():
            model(input_ids=ids_BS, attention_mask=mask_BS)
        recorded_BSLK = recorder.recorded().reshape(B, S, L, K)
        recorder.end_step()
    finally:
        recorder.detach()
        rr_transformers.uninstall()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, foreach=True)
    return _Step(model.train(), ids_BS, mask_BS, optimizer, _rollout_batch(recorded_BSLK, E, K, L))


VARIANTS = ("bare", "off", "r3", "r3_exact", "r3_no_agreement")
_AGREEMENT: dict[str, bool | str] = {"r3": True, "r3_exact": "exact"}


@contextmanager
def _variant(run: _Step, name: str) -> Iterator[ReplayController | None]:
    """rr as variant ``name`` has it: not installed, attached OFF, or R3 armed."""
    if name == "bare":
        rr_transformers.uninstall()
        yield None
        return
    rr_transformers.install()
    E, K = STEP["num_experts"], STEP["num_experts_per_tok"]
    agreement = _AGREEMENT.get(name, False)
    controller = ReplayController(num_experts=E, top_k=K, measure_agreement=agreement)
    rr_transformers.attach(controller, run.model)
    try:
        if name != "off":
            controller.set_mode(ReplayMode.REPLAY)
        yield controller
    finally:
        controller.detach()


def bench_step(rounds: int) -> dict[str, Any]:
    run = _build_step()
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        order = random.Random(0)
        for i in range(rounds + 1):
            for name in order.sample(VARIANTS, len(VARIANTS)):
                with _variant(run, name) as controller:
                    _sync()
                    t_wall, t_cpu = time.perf_counter(), _clock()
                    if controller is not None and name != "off":
                        rr_transformers.arm_routes(
                            controller, 0, run.batch, attention_mask=run.mask_BS
                        )
                    run()
                    if controller is not None:
                        controller.end_step()
                    t_cpu = _clock() - t_cpu
                    t_wall = time.perf_counter() - t_wall
                if i:  # the first round warms up
                    cpu[name].append(t_cpu)
                    wall[name].append(t_wall)
        parts = _parts(run)
    finally:
        rr_transformers.uninstall()
    step_s = {name: statistics.median(ts) for name, ts in cpu.items()}
    wall_s = {name: statistics.median(ts) for name, ts in wall.items()}
    layers = STEP["num_hidden_layers"]
    per_step_us = {
        name: layers * (parts[f"router_us_{name}"] - parts["router_us_bare"])
        for name in VARIANTS[1:]
    }
    for name in ("r3", "r3_exact", "r3_no_agreement"):
        per_step_us[name] += parts["arm_routes_us"] + parts["end_step_us"]
    return {
        "model": "qwen3_moe",
        "transformers": str(rr_transformers.installed_transformers_version()),
        **STEP,
        "rounds": rounds,
        "step_s_bare": step_s["bare"],
        "step_s_replay_off": step_s["off"],
        "step_s_replay_r3": step_s["r3"],
        "step_s_replay_r3_exact": step_s["r3_exact"],
        "step_s_replay_r3_no_agreement": step_s["r3_no_agreement"],
        "step_overhead_ratio_r3": step_s["r3"] / step_s["bare"],
        "r3_over_off": step_s["r3"] / step_s["off"],
        "off_over_bare": step_s["off"] / step_s["bare"],
        "r3_exact_over_bare": step_s["r3_exact"] / step_s["bare"],
        "r3_no_agreement_over_bare": step_s["r3_no_agreement"] / step_s["bare"],
        "step_ratio_r3_paired_quartiles": _quartiles(cpu["r3"], cpu["bare"]),
        "wall_step_s": wall_s,
        "wall_step_overhead_ratio_r3": wall_s["r3"] / wall_s["bare"],
        "parts_us": parts,
        "attributed_overhead_ratio": {
            name: 1.0 + us / (step_s["bare"] * 1e6) for name, us in per_step_us.items()
        },
    }


def _parts(run: _Step, rounds: int = 30, calls: int = 10) -> dict[str, float]:
    """What rr adds, measured alone (median us, process CPU time): one router call, forward
    and backward of its gate weights, on the step's [B*S, H] rows in each variant (alternated),
    and arm_routes / end_step for the step's micro-batch."""
    router = run.model.get_decoder().layers[0].mlp.gate
    rows = STEP["sequences"] * STEP["seq_length"]
    hidden_NH = torch.randn(rows, STEP["hidden_size"], device=DEVICE[0], requires_grad=True)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            with _variant(run, name) as controller:
                if controller is not None and name != "off":
                    rr_transformers.arm_routes(controller, 0, run.batch, attention_mask=run.mask_BS)
                start = _clock()
                for _ in range(calls):
                    weights_NK = router(hidden_NH)[1]  # (logits, gate weights, ids)
                    weights_NK.sum().backward()
                samples[name].append((_clock() - start) / calls * 1e6)
                if controller is not None:
                    controller.release(0)
    parts = {f"router_us_{name}": statistics.median(ts) for name, ts in samples.items()}
    with _variant(run, "r3") as controller:
        assert controller is not None
        env = {"rt": rr_transformers, "ctrl": controller, "run": run}
        parts["arm_routes_us"] = median_us(
            "rt.arm_routes(ctrl, 0, run.batch, attention_mask=run.mask_BS); ctrl.release(0)", env
        )
        parts["end_step_us"] = median_us("ctrl.end_step()", env)
    return parts


def _quartiles(on: list[float], off: list[float]) -> list[float]:
    """Quartiles of the per-round ratio on / off (the spread behind the medians)."""
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return [float(q) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else ratios


def median_us(stmt: str, env: dict[str, Any], min_run_time: float = 1.0) -> float:
    """Median process CPU time of ``stmt`` in microseconds (wall time, synchronized, on an
    accelerator)."""
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads(), timer=_clock)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)


def bench_bookkeeping() -> dict[str, Any]:
    L, E, K = BOOK["layers"], BOOK["experts"], BOOK["top_k"]
    B, S = BOOK["sequences"], BOOK["seq_length"]
    model = tiny_model(
        "qwen3_moe",
        num_hidden_layers=L,
        num_experts=E,
        num_experts_per_tok=K,
        moe_intermediate_size=2,
        mlp_only_layers=[],
    )
    g = torch.Generator().manual_seed(1)
    first_N1 = torch.randint(0, E, (B * S * L, 1), generator=g)
    routes_NK = (first_N1 + torch.arange(K)) % E  # distinct ids per row; values do not matter
    batch = _rollout_batch(routes_NK.reshape(B, S, L, K).to(torch.uint8), E, K, L)
    decoded = _decoded_batch(routes_NK.reshape(B, S, L, K).to(torch.uint8), E, K, L)
    mask_BS = torch.ones(B, S, dtype=torch.long)
    position_ids = torch.arange(S).repeat(B)[None]
    controller = ReplayController(num_experts=E, top_k=K)
    rr_transformers.install()
    try:
        layers = rr_transformers.attach(controller, model).layer_numbers
        assert len(layers) == L
        controller.set_mode(ReplayMode.REPLAY)
        laid_NLK, replay_N = rr_transformers.routes_for_padded(batch, mask_BS)
        env: dict[str, Any] = {
            "ctrl": controller,
            "rt": rr_transformers,
            "batch": batch,
            "decoded": decoded,
            "mask": mask_BS,
            "pos": position_ids,
            "laid": laid_NLK,
            "replay": replay_N,
            "layers": batch.meta.layer_numbers,
        }
        padded = median_us(
            "rt.arm_routes(ctrl, 0, batch, attention_mask=mask); ctrl.release(0)", env
        )
        packed = median_us("rt.arm_routes(ctrl, 0, batch, position_ids=pos); ctrl.release(0)", env)
        decoded_packed = median_us(
            "rt.arm_routes(ctrl, 0, decoded, position_ids=pos); ctrl.release(0)", env
        )
        layout = median_us("rt.routes_for_padded(batch, mask)", env)
        padded_laid_out = median_us(
            "laid_out, rows = rt.routes_for_padded(batch, mask); "
            "ctrl.arm(0, laid_out, layer_numbers=layers, replay_mask_T=rows, validate=False); "
            "ctrl.release(0)",
            env,
        )
        laid_out = median_us(
            "ctrl.arm(0, laid, layer_numbers=layers, replay_mask_T=replay, validate=False); "
            "ctrl.release(0)",
            env,
        )
        step_end = median_us("ctrl.end_step()", env)
    finally:
        controller.detach()
        rr_transformers.uninstall()
    return {
        **{f"bookkeeping_{k}": v for k, v in BOOK.items()},
        "bookkeeping_us_per_microbatch_94_layers": padded + step_end,
        "bookkeeping_packed_us_per_microbatch_94_layers": packed + step_end,
        "bookkeeping_decoded_packed_us_per_microbatch_94_layers": decoded_packed + step_end,
        "arm_routes_padded_us": padded,
        "arm_padded_laid_out_us": padded_laid_out,
        "arm_routes_packed_us": packed,
        "layout_padded_us": layout,
        "arm_laid_out_us": laid_out,
        "end_step_us": step_end,
    }


def _probe_us(model: Any, rounds: int) -> tuple[float, float, int]:
    """What the probe adds to one ``attach`` + ``detach`` of ``model``, the attach without it
    (microseconds, medians of ``rounds`` alternated pairs) and the routers attached."""
    from rr_transformers import _attach
    from rr_transformers._probe import prove_hooks as real

    names = vars(_attach)  # attach calls the name _attach imported
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)

    def once(probe: Callable[..., None]) -> float:
        names["prove_hooks"] = probe
        start = _clock()
        rr_transformers.attach(controller, model)
        rr_transformers.detach(controller)
        return _clock() - start

    try:
        routers = len(rr_transformers.attach(controller, model).layer_numbers)
        rr_transformers.detach(controller)
        with_probe, without = [], []
        for _ in range(rounds):
            with_probe.append(once(real))
            without.append(once(lambda *_args: None))
    finally:
        names["prove_hooks"] = real
    probe = statistics.median(a - b for a, b in zip(with_probe, without, strict=True))
    return probe * 1e6, statistics.median(without) * 1e6, routers


def bench_probe(rounds: int = 40) -> dict[str, Any]:
    """Per family: what the probe adds to one ``attach`` (+ ``detach``), per router and in all,
    and the attach itself without it; then Qwen3-MoE with 32 routed layers, whose cost per
    router leaves out the probe's fixed part (microseconds of process CPU time)."""
    from rr_transformers import KNOWN_FAMILIES, installed_transformers_version

    version = installed_transformers_version()
    if version is None:
        raise SystemExit("the probe benchmark needs transformers installed")
    figures: dict[str, Any] = {"probe_transformers": str(version)}
    rr_transformers.install()
    try:
        for model_type in sorted(n for n, f in KNOWN_FAMILIES.items() if f.available(version)):
            probe, attach, routers = _probe_us(tiny_model(model_type), rounds)
            figures[f"probe_us_per_router_{model_type}"] = probe / routers
            figures[f"probe_us_per_attach_{model_type}"] = probe
            figures[f"attach_us_without_probe_{model_type}"] = attach
        deep = tiny_model("qwen3_moe", num_hidden_layers=32, mlp_only_layers=[])
        probe, _, routers = _probe_us(deep, rounds // 4)
        figures["probe_us_per_router_qwen3_moe_32_layers"] = probe / routers
    finally:
        rr_transformers.uninstall()
    per_router = [
        v for k, v in figures.items() if k.startswith("probe_us_per_router_") and "layers" not in k
    ]
    figures["probe_us_per_router_median"] = statistics.median(per_router)
    return figures


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
