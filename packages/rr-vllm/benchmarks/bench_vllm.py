"""Rollout-side benchmark: decoding plus assembly of a Qwen3-30B-A3B-shaped capture (48 MoE layers
on a 48-layer axis, 128 experts, top-8, uint8 as vLLM 0.22+ returns it) into a validated
``RouteBatch``, and on into the trainer's padded int16 layout.

Each figure is a throughput ratio to a plain memory copy (``np.copyto``, one thread) of the same
uint8 payload (copy time / measured time), so ratios hold across machines. The candidates run in
alternation, round after round, and each ratio is the median over rounds of that round's copy
over its time (a shared machine drifts; neighbours in time see the same drift). The two goals:

- ``vllm_datapath_vs_memcpy`` >= 0.5: ``rr_vllm.decode_vllm_output(outputs, options).to_batch()``
  with ``validate=False``
  (decode, structural checks, one copy into the batch), in a loop's steady state: the batch
  lands in the memory of the one dropped before it (:func:`rr_core.buffers.recycled`), as the
  copy lands in a buffer written before; ``vllm_datapath_fresh_buffer_vs_memcpy`` is the same
  into freshly mapped memory (a loop's first step);
- ``vllm_idchecks_per_core_vs_memcpy`` >= 0.25 per kernel: rr_core's id checks
  (``RouteBatch.validate``: range, K distinct ids, all-zero capture, empty dense slots) on one
  thread; ``vllm_idchecks_vs_memcpy`` has them at each thread count, so the scaling shows.

``vllm_assembly_vs_memcpy`` is the default ``to_batch()`` (both, checks on);
``vllm_per_sample_vs_memcpy`` decodes each output on its own and batches with
``validate_samples``.

Usage: ``python bench_vllm.py [--samples 256] [--tokens 4096] [--json] [--repeat 7]`` (the
defaults are the rollout step of 256 x 4096 tokens, about 400 MB).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from bench_common import alternate, report, sizes_parser

from rr_core import RouteMeta, buffers, kernels
from rr_core.routes import idcheck_words
from rr_vllm import DecodeOptions, decode_vllm_output, to_trainer_layout, validate_samples

LAYERS, EXPERTS, TOP_K = 48, 128, 8
META = RouteMeta(
    num_experts=EXPERTS,
    top_k=TOP_K,
    layer_axis="all_layers",
    layer_numbers=tuple(range(1, LAYERS + 1)),
)


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


@contextmanager
def fresh_buffers() -> Iterator[None]:
    """Every buffer in the block is freshly mapped memory (rr_core.buffers recycles none)."""
    before = buffers.MIN_RECYCLED_BYTES
    buffers.MIN_RECYCLED_BYTES = 1 << 62
    try:
        yield
    finally:
        buffers.MIN_RECYCLED_BYTES = before


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ratios(times: dict[str, list[float]], base: str) -> dict[str, float]:
    """Median over rounds of ``base``'s time over each candidate's time in the same round."""
    return {
        name: statistics.median(b / t for b, t in zip(times[base], ts, strict=True))
        for name, ts in times.items()
    }


def available_kernels() -> list[str]:
    return [k for k in kernels.KERNELS if k != "numba" or kernels.numba_available()]


def thread_counts() -> list[int]:
    return sorted({1, 2, torch.get_num_threads()})


def run(samples: int, tokens: int, repeat: int) -> dict[str, Any]:
    meta = META
    reqs = requests(samples, tokens)
    payload = np.stack([r.outputs[0].routed_experts for r in reqs])
    target = np.empty_like(payload)
    prompts = [len(r.prompt_token_ids) for r in reqs]
    threads = torch.get_num_threads()
    options, unchecked = DecodeOptions(meta=meta), DecodeOptions(meta=meta, validate=False)

    def copy() -> None:
        np.copyto(target, payload)

    def decode() -> list[Any]:
        return [s for r in reqs for s in decode_vllm_output(r, options)]

    def per_sample() -> Any:
        return validate_samples(decode(), meta)

    def datapath() -> Any:
        return decode_vllm_output(reqs, unchecked).to_batch()

    def datapath_fresh() -> Any:  # the first step of a loop: no dropped batch to reuse
        with fresh_buffers():
            return decode_vllm_output(reqs, unchecked).to_batch()

    def assemble() -> Any:
        return decode_vllm_output(reqs, options).to_batch()

    batch = assemble()
    assert batch.equal(per_sample())
    assert batch.equal(datapath())

    def layout() -> Any:
        return to_trainer_layout(
            batch, prompts, prompt_length=tokens // 4, response_length=tokens - tokens // 4
        )

    main = {
        "memcpy": copy,
        "datapath": datapath,
        "datapath_fresh_buffer": datapath_fresh,
        "assembly": assemble,
        "decode": decode,
        "per_sample": per_sample,
        "trainer_layout": layout,
    }
    times = alternate(main, repeat)
    ratio = ratios(times, "memcpy")
    ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}

    checks: dict[str, dict[str, float]] = {}
    kernel_only: dict[str, dict[str, float]] = {}
    for kernel in available_kernels():
        checks[kernel], kernel_only[kernel] = {}, {}
        with kernels.use_kernel(kernel):
            batch.validate()  # numba compiles (or loads its cache) on first use
            for n in thread_counts():
                torch.set_num_threads(n)
                t = alternate(
                    {
                        "memcpy": copy,
                        "checks": batch.validate,
                        "kernel": lambda: idcheck_words.word_flags(batch.values_NLK, EXPERTS),
                    },
                    repeat,
                )
                r = ratios(t, "memcpy")
                checks[kernel][str(n)], kernel_only[kernel][str(n)] = r["checks"], r["kernel"]
        torch.set_num_threads(threads)
    default = kernels.kernel()
    mb = payload.nbytes / 1e6
    return {
        "samples": samples,
        "tokens_per_sample": tokens,
        "payload_mb": mb,
        "threads": threads,
        "idcheck_kernel": default,
        "memcpy_ms": ms["memcpy"],
        "datapath_ms": ms["datapath"],
        "decode_ms": ms["decode"],
        "assembly_ms": ms["assembly"],
        "per_sample_ms": ms["per_sample"],
        "checks_ms": ms["memcpy"] / checks[default][str(threads)],
        "trainer_layout_ms": ms["trainer_layout"],
        "vllm_datapath_vs_memcpy": ratio["datapath"],
        "vllm_datapath_fresh_buffer_vs_memcpy": ratio["datapath_fresh_buffer"],
        "vllm_idchecks_per_core_vs_memcpy": {k: v["1"] for k, v in checks.items()},
        "vllm_idchecks_vs_memcpy": checks,
        "vllm_idcheck_kernel_vs_memcpy": kernel_only,
        "vllm_decode_vs_memcpy": ratio["decode"],
        "vllm_assembly_vs_memcpy": ratio["assembly"],
        "vllm_per_sample_vs_memcpy": ratio["per_sample"],
        "vllm_checks_vs_memcpy": checks[default][str(threads)],
        "vllm_trainer_layout_vs_memcpy": ratio["trainer_layout"],
        "assembly_gb_per_s": mb / ms["assembly"],
    }


def main() -> None:
    args = sizes_parser(__doc__, samples=256).parse_args()
    report(run(args.samples, args.tokens, args.repeat), args.json, width=34)


if __name__ == "__main__":
    main()
