"""Route codec benchmark on a Qwen3-30B-A3B-shaped batch: 48 MoE layers, 128 experts, top-8.

Reports bytes per token of each codec against the floors (raw 384, packed 336, set <= 246, the
information floor log2 C(128, 8) * 48 / 8 = 242.3) and encode / decode throughput as a ratio to
a plain memory copy of the raw payload (``Tensor.copy_`` into a buffer allocated beforehand, so
page faults do not slow the baseline) timed in the same run, so the ratios hold across machines.
Goals: packed >= 1/2 of the copy to decode, >= 1/8 to encode; set >= 1/10 to decode, >= 1/32 to
encode. The default batch is a rollout step of 256 x 4096 tokens (about 400 MB raw), the size a
trainer ships; ``--tokens 32768`` (12.6 MB) shows the in-cache case, where the copy runs at cache
bandwidth.

``codecs`` holds the figures of the kernel family that runs by default (numba where it imports,
:mod:`rr_core.kernels`); ``by_kernel`` holds every family's decode, timed in the same run, so
the compiled and numpy decoders stand side by side.

Usage: ``python bench_codecs.py [--tokens N] [--json] [--threads N]``.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch
from torch.utils.benchmark import Timer

from rr_core import RouteBatch, RouteMeta, kernels
from rr_core.codecs.encoding import CODECS, bytes_per_token, decode_routes, encode_routes

LAYERS, EXPERTS, TOP_K = 48, 128, 8
FLOORS = {"raw": 384.0, "packed": 336.0, "set": 246.0}


def qwen_batch(tokens: int) -> RouteBatch:
    """Distinct random ids per (token, layer) (drawn from 2**16 random top-k sets, so that a
    batch of a million tokens builds in seconds), every row valid, 16 sequences."""
    g = torch.Generator().manual_seed(0)
    pool = torch.rand(1 << 16, EXPERTS, generator=g).topk(TOP_K, dim=1).indices
    ids = pool[torch.randint(0, 1 << 16, (tokens * LAYERS,), generator=g)]
    meta = RouteMeta(
        num_experts=EXPERTS,
        top_k=TOP_K,
        layer_axis="moe_layers",
        layer_numbers=tuple(range(1, LAYERS + 1)),
    )
    offsets = torch.linspace(0, tokens, 17).round().to(torch.int64)
    return RouteBatch(ids.reshape(tokens, LAYERS, TOP_K).to(torch.uint8), offsets, None, meta)


def seconds(stmt: str, env: dict[str, Any]) -> float:
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=1.0).median)


def run(tokens: int) -> dict[str, Any]:
    batch = qwen_batch(tokens)
    env: dict[str, Any] = {"batch": batch, "encode": encode_routes, "decode": decode_routes}
    env["target"] = torch.empty_like(batch.values_NLK)
    copy = seconds("target.copy_(batch.values_NLK)", env)
    floor = math.log2(math.comb(EXPERTS, TOP_K)) * LAYERS / 8
    out: dict[str, Any] = {
        "tokens": tokens,
        "raw_payload_mb": batch.values_NLK.numel() / 1e6,
        "copy_ms": copy * 1e3,
        "floor_bytes_per_token": floor,
        "codecs": {},
    }
    for codec in CODECS:
        env["codec"], env["enc"] = codec, encode_routes(batch, codec)
        enc_s = seconds("encode(batch, codec)", env)
        dec_s = seconds("decode(enc)", env)
        out["codecs"][codec] = {
            "bytes_per_token": bytes_per_token(batch.meta, codec),
            "goal_bytes_per_token": FLOORS[codec],
            "measured_bytes_per_token": env["enc"].bytes_per_token,
            "encode_ms": enc_s * 1e3,
            "decode_ms": dec_s * 1e3,
            "encode_over_copy": copy / enc_s,
            "decode_over_copy": copy / dec_s,
        }
    out["kernel"] = kernels.kernel()
    out["by_kernel"] = by_kernel(env)
    return out


def by_kernel(env: dict[str, Any]) -> dict[str, Any]:
    """Decode of every codec under every kernel family, each against a copy timed next to it."""
    families = kernels.KERNELS if kernels.numba_available() else ("numpy",)
    out: dict[str, Any] = {}
    for family in families:
        with kernels.use_kernel(family):
            out[family] = {}
            for codec in CODECS:
                env["enc"] = encode_routes(env["batch"], codec)
                copy = seconds("target.copy_(batch.values_NLK)", env)
                dec_s = seconds("decode(enc)", env)
                out[family][codec] = {"decode_ms": dec_s * 1e3, "decode_over_copy": copy / dec_s}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256 * 4096)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args.tokens)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{result['tokens']} tokens, raw payload {result['raw_payload_mb']:.1f} MB, "
        f"copy {result['copy_ms']:.2f} ms, floor {result['floor_bytes_per_token']:.1f} B/token"
    )
    print(f"kernel family: {result['kernel']}")
    for codec, r in result["codecs"].items():
        print(
            f"{codec:>6}: {r['bytes_per_token']:g} B/token (goal {r['goal_bytes_per_token']:g}; "
            f"measured {r['measured_bytes_per_token']:.3f} with validity), encode "
            f"{r['encode_ms']:.1f} ms ({r['encode_over_copy']:.3f} x copy speed), decode "
            f"{r['decode_ms']:.1f} ms ({r['decode_over_copy']:.3f} x copy speed)"
        )

    for family, codecs in result["by_kernel"].items():
        figures = ", ".join(f"{c} {r['decode_over_copy']:.3f}" for c, r in codecs.items())
        print(f"decode x copy speed under {family}: {figures}")


if __name__ == "__main__":
    main()
