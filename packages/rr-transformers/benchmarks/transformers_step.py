"""bench_transformers' training-step workload: a real Qwen3-MoE step in five variants (rr absent,
attached OFF, R3 with each agreement), alternated round by round, and what rr adds to it
measured alone."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers_measure import DEVICE, clock, median_us, quartiles, sync

import rr_transformers
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta
from rr_fakes.shims.hf_models import tiny_model

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


def rollout_batch(
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
    return _Step(model.train(), ids_BS, mask_BS, optimizer, rollout_batch(recorded_BSLK, E, K, L))


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
                    sync()
                    t_wall, t_cpu = time.perf_counter(), clock()
                    if controller is not None and name != "off":
                        rr_transformers.arm_routes(
                            controller, 0, run.batch, attention_mask=run.mask_BS
                        )
                    run()
                    if controller is not None:
                        controller.end_step()
                    t_cpu = clock() - t_cpu
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
        **{f"step_s_replay_{name}": step_s[name] for name in VARIANTS[1:]},
        "step_overhead_ratio_r3": step_s["r3"] / step_s["bare"],
        "r3_over_off": step_s["r3"] / step_s["off"],
        "off_over_bare": step_s["off"] / step_s["bare"],
        "r3_exact_over_bare": step_s["r3_exact"] / step_s["bare"],
        "r3_no_agreement_over_bare": step_s["r3_no_agreement"] / step_s["bare"],
        "step_ratio_r3_paired_quartiles": quartiles(cpu["r3"], cpu["bare"]),
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
                start = clock()
                for _ in range(calls):
                    weights_NK = router(hidden_NH)[1]  # (logits, gate weights, ids)
                    weights_NK.sum().backward()
                samples[name].append((clock() - start) / calls * 1e6)
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
