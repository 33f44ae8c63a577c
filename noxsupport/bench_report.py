"""The benchmarks ``nox -s bench`` runs (one process each) and its report: the headline figures
and their table, from the benchmarks' JSON output (kept out of the noxfile: formatting reports is
not a session's job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "bench_commands", "bench_device", "bench_figures", "bench_table"]

#: Each benchmark runs in its own process and prints one JSON object with ``--json``.
BENCHMARKS = {
    "core": "rr-core/benchmarks/bench_core.py",
    "codecs": "rr-core/benchmarks/bench_codecs.py",
    "vllm": "rr-vllm/benchmarks/bench_vllm.py",
    "vllm_verl": "rr-vllm/benchmarks/bench_vllm_verl.py",
    "megatron": "rr-megatron-compat/benchmarks/bench_megatron.py",
    "verl": "rr-megatron-compat/benchmarks/bench_verl.py",
    "transformers": "rr-transformers/benchmarks/bench_transformers.py",
}


#: The benchmarks that take ``--device`` (the replay path: top-k, agreement, a training step).
DEVICE_BENCHMARKS = ("core", "megatron", "transformers")


def bench_device(posargs: list[str]) -> str:
    """The ``--device`` of ``nox -s bench -- --device cuda`` (cpu when absent)."""
    for i, arg in enumerate(posargs):
        if arg == "--device" and i + 1 < len(posargs):
            return posargs[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return "cpu"


def bench_commands(packages: Path, posargs: list[str]) -> dict[str, list[str]]:
    """Each benchmark's command line (its script under ``packages``), JSON out, with the
    ``--device`` of the posargs for those that take one."""
    device = bench_device(posargs)
    return {
        name: [
            "python", str(packages / script), "--json",
            *(["--device", device] if name in DEVICE_BENCHMARKS else []),
        ]
        for name, script in BENCHMARKS.items()
    }  # fmt: skip


def bench_figures(runs: dict[str, Any]) -> dict[str, Any]:
    """The headline figures (names fixed: other tools read bench-results.json)."""
    core, codecs, vllm_run, mcore = runs["core"], runs["codecs"], runs["vllm"], runs["megatron"]
    verl_run, tf = runs["verl"], runs["transformers"]
    mcore_ran = "step_s_replay_r3" in mcore  # the megatron harness runs on CPU only
    return {
        "device": core.get("device", "cpu"),
        "replay_topk_over_native": core["replay_topk_over_native"],
        "replay_topk_masked_over_native": core["replay_topk_masked_over_native"],
        "replay_topk_masked_full_topk_over_native": core[
            "replay_topk_masked_full_topk_over_native"
        ],
        "r3_call_agreement_threshold_over_native": core["r3_call_agreement_threshold_over_native"],
        "r3_call_agreement_exact_over_native": core["r3_call_agreement_exact_over_native"],
        "bookkeeping_us_per_microbatch_94_layers": core["bookkeeping_us_per_microbatch_94_layers"],
        "step_overhead_ratio_r3": (
            mcore["step_s_replay_r3"] / mcore["step_s_replay_off"] if mcore_ran else None
        ),
        "step_overhead_ratio_r3_exact": (
            mcore["step_s_replay_r3_exact"] / mcore["step_s_replay_off"] if mcore_ran else None
        ),
        "step_overhead_ratio_r3_router_shaped": (
            mcore["router_shaped"]["r3_over_off"] if "router_shaped" in mcore else None
        ),
        "router_call_r3_over_native_router_shaped": (
            mcore["router_shaped"]["router_call_r3_over_native"]
            if "router_shaped" in mcore
            else None
        ),
        "payload_bytes_per_token": {c: v["bytes_per_token"] for c, v in codecs["codecs"].items()},
        "codec_speed_vs_memcpy": {
            c: {"encode": v["encode_over_copy"], "decode": v["decode_over_copy"]}
            for c, v in codecs["codecs"].items()
        },
        "vllm_assembly_vs_memcpy": vllm_run["vllm_assembly_vs_memcpy"],
        "vllm_datapath_vs_memcpy": vllm_run["vllm_datapath_vs_memcpy"],
        "vllm_datapath_fresh_buffer_vs_memcpy": vllm_run["vllm_datapath_fresh_buffer_vs_memcpy"],
        "vllm_idchecks_per_core_vs_memcpy": vllm_run["vllm_idchecks_per_core_vs_memcpy"],
        "vllm_idchecks_vs_memcpy": vllm_run["vllm_idchecks_vs_memcpy"],
        "vllm_verl_rr_over_verl": runs["vllm_verl"]["side_by_side"]["rr_over_verl"],
        "vllm_verl_bytes_over_verl": runs["vllm_verl"]["side_by_side"]["bytes_over_verl"],
        "verl_bookkeeping_rr_over_verl": verl_run["bookkeeping"]["bookkeeping_per_microbatch"][
            "rr_over_verl_cpu"
        ],
        "verl_r2_merge_rr_over_verl": verl_run["merge"]["layers_48"]["rr_over_verl_cpu"],
        "verl_step_overhead_dropin": verl_run["step"]["rr_dropin_over_off_cpu"],
        "verl_step_overhead_verl": verl_run["step"]["verl_over_off_cpu"],
        "transformers_step_overhead_ratio_r3": tf["step_overhead_ratio_r3"],
        "transformers_step_overhead_ratio_r3_exact": tf["r3_exact_over_bare"],
        "transformers_step_overhead_attributed_r3": tf["attributed_overhead_ratio"]["r3"],
        "transformers_bookkeeping_us_per_microbatch_94_layers": tf[
            "bookkeeping_decoded_packed_us_per_microbatch_94_layers"
        ],
        "transformers_bookkeeping_padded_us_per_microbatch_94_layers": tf[
            "bookkeeping_us_per_microbatch_94_layers"
        ],
        "transformers_arm_padded_us_94_layers": tf["arm_routes_padded_us"],
        "transformers_arm_padded_laid_out_us_94_layers": tf["arm_padded_laid_out_us"],
        "workloads": {
            "replay_topk_over_native": "4096 tokens x 128 experts, top-8, every row replayed",
            "replay_topk_masked_over_native": "the same with R3's replay mask (last row native)",
            "replay_topk_masked_full_topk_over_native": (
                "the same mask applied after a full native top-k (before)"
            ),
            "r3_call_agreement_threshold_over_native": (
                "one R3 router call through the controller, agreement by the threshold test, "
                "over the native top-k"
            ),
            "r3_call_agreement_exact_over_native": "the same, agreement by a second top-k",
            "bookkeeping_us_per_microbatch_94_layers": "arm (validated upstream) + end_step",
            "step_overhead_ratio_r3": (
                f"real GPTModel step on CPU, megatron-core {mcore['megatron_core']}, "
                f"hidden {mcore['hidden_size']}, {mcore['sequences']} x {mcore['seq_length']} "
                "tokens, R3 replay (mask, agreement reported) / rr without a controller"
            )
            if mcore_ran
            else "megatron-core harness: CPU only",
            "step_overhead_ratio_r3_exact": "the same, agreement by a second top-k",
            "step_overhead_ratio_r3_router_shaped": (
                "the same GPTModel with Qwen3-30B-A3B's routers (E=128, top-8, experts H / 4 "
                "wide), 2 x 512 tokens, R3 with agreement / rr without a controller"
            ),
            "router_call_r3_over_native_router_shaped": (
                "one router call of that model, R3 with agreement / native"
            ),
            "payload_bytes_per_token": "Qwen3-30B-A3B: 48 MoE layers, 128 experts, top-8",
            "codec_speed_vs_memcpy": f"{codecs['tokens']} tokens of that shape vs a copy",
            "vllm_assembly_vs_memcpy": (
                f"{vllm_run['samples']} samples x {vllm_run['tokens_per_sample']} tokens, "
                "48 layers, top-8, uint8: decode_vllm_output(...).to_batch() "
                "(decode, validate, batch) vs a copy"
            ),
            "vllm_datapath_vs_memcpy": (
                "256 x 4096 tokens, 48 layers, top-8, uint8: decode_vllm_output(...).to_batch(), "
                "validate=False (decode, structural checks, batch) vs a one-thread copy, a "
                "rollout loop's steady state (the batch reuses the dropped one's memory)"
            ),
            "vllm_datapath_fresh_buffer_vs_memcpy": (
                "the same into freshly mapped memory (a loop's first step)"
            ),
            "vllm_idchecks_per_core_vs_memcpy": "RouteBatch.validate per kernel, one thread",
            "vllm_idchecks_vs_memcpy": "RouteBatch.validate per kernel and thread count",
            "vllm_verl_rr_over_verl": (
                "64 x ~4096 tokens: each rr path (decode, + to_trainer_layout, + codecs) over "
                "verl 0.9.1's own rollout conversion, alternated, median of per-round ratios"
            ),
            "vllm_verl_bytes_over_verl": "bytes each rr path ships over verl's int16",
            "verl_bookkeeping_rr_over_verl": (
                "rr_megatron_compat.verl / verl 0.9.1, thread CPU time: set_router_replay_data + "
                "action switching + arming per micro-batch, 48 MoE layers, 4096 tokens"
            ),
            "verl_r2_merge_rr_over_verl": "merge_router_topk_indices, 48 MoE layers, 4096 tokens",
            "verl_step_overhead_dropin": "R3 training step through the drop-in / no replay",
            "verl_step_overhead_verl": "R3 training step through verl's replay / no replay",
            "transformers_step_overhead_ratio_r3": (
                f"real qwen3_moe step on CPU, transformers {tf['transformers']}, hidden "
                f"{tf['hidden_size']}, {tf['num_hidden_layers']} layers, {tf['num_experts']} "
                f"experts top-{tf['num_experts_per_tok']}, {tf['sequences']} x "
                f"{tf['seq_length']} tokens: R3 / rr not installed, CPU time"
            ),
            "transformers_step_overhead_ratio_r3_exact": "the same, agreement by a second top-k",
            "transformers_step_overhead_attributed_r3": (
                "the same, from rr's own measured costs (router calls, arm_routes, end_step)"
            ),
            "transformers_bookkeeping_us_per_microbatch_94_layers": (
                "arm_routes + end_step, 94 layers, E=128, top-8, 4096 rows packed in one row, "
                "the batch as rr_vllm decodes it"
            ),
            "transformers_bookkeeping_padded_us_per_microbatch_94_layers": (
                "the same rows right-padded (armed through a row index into the batch)"
            ),
            "transformers_arm_padded_us_94_layers": "arm_routes of that padded batch",
            "transformers_arm_padded_laid_out_us_94_layers": (
                "the same laid out row by row first, then armed (before)"
            ),
        },
        "runs": runs,
    }


def bench_table(figures: dict[str, Any]) -> str:
    rows = [
        (
            name,
            "n/a" if figures[name] is None else f"{figures[name]:.4g}",
            figures["workloads"][name],
        )
        for name in (
            "replay_topk_over_native",
            "replay_topk_masked_over_native",
            "replay_topk_masked_full_topk_over_native",
            "r3_call_agreement_threshold_over_native",
            "r3_call_agreement_exact_over_native",
            "bookkeeping_us_per_microbatch_94_layers",
            "step_overhead_ratio_r3",
            "step_overhead_ratio_r3_exact",
            "step_overhead_ratio_r3_router_shaped",
            "router_call_r3_over_native_router_shaped",
            "vllm_assembly_vs_memcpy",
            "vllm_datapath_vs_memcpy",
            "vllm_datapath_fresh_buffer_vs_memcpy",
            "verl_bookkeeping_rr_over_verl",
            "verl_r2_merge_rr_over_verl",
            "verl_step_overhead_dropin",
            "verl_step_overhead_verl",
            "transformers_step_overhead_ratio_r3",
            "transformers_step_overhead_ratio_r3_exact",
            "transformers_step_overhead_attributed_r3",
            "transformers_bookkeeping_us_per_microbatch_94_layers",
            "transformers_bookkeeping_padded_us_per_microbatch_94_layers",
            "transformers_arm_padded_us_94_layers",
            "transformers_arm_padded_laid_out_us_94_layers",
        )
    ]
    rows.insert(0, ("device", figures["device"], "where the replay figures ran"))
    for codec, size in figures["payload_bytes_per_token"].items():
        speed = figures["codec_speed_vs_memcpy"][codec]
        rows.append(
            (
                f"codec {codec}",
                f"{size:g} B/token",
                f"encode {speed['encode']:.3f}x, decode {speed['decode']:.3f}x of memcpy",
            )
        )
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>14}  {c}" for a, b, c in rows)
