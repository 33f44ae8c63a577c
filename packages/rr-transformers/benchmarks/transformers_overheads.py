"""bench_transformers' fixed costs: the per-micro-batch bookkeeping on a 94-layer model and the
attach-time probe per family."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from transformers_measure import clock, median_us
from transformers_step import rollout_batch

import rr_transformers
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_model

#: The bookkeeping workload (bench_core's: 4096 rows, 94 layers, E=128, top-8).
BOOK = {"layers": 94, "experts": 128, "top_k": 8, "sequences": 16, "seq_length": 256}


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


def bench_bookkeeping() -> dict[str, Any]:
    L, E, K = BOOK["layers"], BOOK["experts"], BOOK["top_k"]
    B, S = BOOK["sequences"], BOOK["seq_length"]
    model = tiny_model(
        "qwen3_moe",
        num_hidden_layers=L,
        num_experts=E,
        num_experts_per_tok=K,
        moe_intermediate_size=4,  # grouped_mm (transformers 5) wants 16-byte strides
        mlp_only_layers=[],
    )
    g = torch.Generator().manual_seed(1)
    first_N1 = torch.randint(0, E, (B * S * L, 1), generator=g)
    routes_NK = (first_N1 + torch.arange(K)) % E  # distinct ids per row; values do not matter
    batch = rollout_batch(routes_NK.reshape(B, S, L, K).to(torch.uint8), E, K, L)
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
        start = clock()
        rr_transformers.attach(controller, model)
        rr_transformers.detach(controller)
        return clock() - start

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
