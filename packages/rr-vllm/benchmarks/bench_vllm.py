"""Rollout-side benchmark: decoding plus assembly of a Qwen3-30B-A3B-shaped capture (48 MoE layers
on a 48-layer axis, 128 experts, top-8, uint8 as vLLM 0.22+ returns it) into a validated
``RouteBatch``, and on into the trainer's padded int16 layout.

Each figure is a throughput ratio to a plain memory copy (``np.copyto``) of the same uint8 payload
timed in the same run (copy time / measured time), so ratios hold across machines. Goal: decoding
+ batching >= 0.5. ``vllm_assembly_vs_memcpy`` is :func:`rr_vllm.decode_vllm_batch` (one copy into
the batch, then rr_core's id checks); ``vllm_per_sample_vs_memcpy`` decodes each output on its own
and batches with ``validate_samples``; ``vllm_checks_vs_memcpy`` is the id checks alone.

Usage: ``python bench_vllm.py [--samples 256] [--tokens 4096] [--json] [--repeat 5]`` (the
defaults are the rollout step of 256 x 4096 tokens, about 400 MB).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from rr_core import RouteMeta
from rr_vllm import decode_vllm_batch, decode_vllm_output, to_trainer_layout, validate_samples

LAYERS, EXPERTS, TOP_K = 48, 128, 8


def requests(samples: int, tokens: int, *, vary: bool = False) -> list[Any]:
    """Duck-typed vLLM 0.22+ outputs: a quarter prompt, the rest generated, T-1 rows each;
    ``vary`` makes sample i ``i % 64`` tokens shorter (verl stacks equal lengths into a dense
    tensor, not a jagged one)."""
    rng = np.random.default_rng(0)
    base = np.argsort(rng.random((257, EXPERTS)), axis=1)[:, :TOP_K].astype(np.uint8)
    p = tokens // 4
    out = []
    for i in range(samples):
        t = tokens - i % 64 if vary else tokens
        pick = rng.integers(0, len(base), size=(t - 1, LAYERS))
        completion = SimpleNamespace(
            index=0,
            token_ids=list(range(t - p)),
            routed_experts=base[pick],
            finish_reason="length",
        )
        out.append(
            SimpleNamespace(
                request_id=str(i), prompt_token_ids=list(range(p)), outputs=[completion]
            )
        )
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(samples: int, tokens: int, repeat: int) -> dict[str, Any]:
    meta = RouteMeta(
        num_experts=EXPERTS,
        top_k=TOP_K,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, LAYERS + 1)),
    )
    reqs = requests(samples, tokens)
    payload = np.stack([r.outputs[0].routed_experts for r in reqs])
    target = np.empty_like(payload)
    prompts = [len(r.prompt_token_ids) for r in reqs]

    def decode() -> list[Any]:
        return [s for r in reqs for s in decode_vllm_output(r, meta)]

    def per_sample() -> Any:
        return validate_samples(decode(), meta)

    def assemble() -> Any:
        return decode_vllm_batch(reqs, meta)

    batch = assemble()
    assert batch.equal(per_sample())
    copy = best(lambda: np.copyto(target, payload), repeat)
    t_decode = best(decode, repeat)
    t_per_sample = best(per_sample, repeat)
    t_assemble = best(assemble, repeat)
    t_checks = best(batch.validate, repeat)
    t_layout = best(
        lambda: to_trainer_layout(
            batch, prompts, prompt_length=tokens // 4, response_length=tokens - tokens // 4
        ),
        repeat,
    )
    mb = payload.nbytes / 1e6
    return {
        "samples": samples,
        "tokens_per_sample": tokens,
        "payload_mb": mb,
        "memcpy_ms": copy * 1e3,
        "decode_ms": t_decode * 1e3,
        "assembly_ms": t_assemble * 1e3,
        "per_sample_ms": t_per_sample * 1e3,
        "checks_ms": t_checks * 1e3,
        "trainer_layout_ms": t_layout * 1e3,
        "vllm_decode_vs_memcpy": copy / t_decode,
        "vllm_assembly_vs_memcpy": copy / t_assemble,
        "vllm_per_sample_vs_memcpy": copy / t_per_sample,
        "vllm_checks_vs_memcpy": copy / t_checks,
        "vllm_trainer_layout_vs_memcpy": copy / t_layout,
        "assembly_gb_per_s": mb / 1e3 / t_assemble,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.samples, args.tokens, args.repeat)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:32s} {value:.3f}" if isinstance(value, float) else f"{key:32s} {value}")


if __name__ == "__main__":
    main()
