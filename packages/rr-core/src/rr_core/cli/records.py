"""``rr inspect``, ``rr convert`` and ``rr verify`` for record files.

Like every ``rr`` command module, this one imports no torch at import time: the ``rr`` command
must start even where importing torch fails. Torch-dependent modules load inside the commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rr_core.records.file import RecordHeader
    from rr_core.routes.batch import RouteBatch

_BARS = " ▁▂▃▄▅▆▇█"
_COLUMNS = 64


def expert_load(batch: RouteBatch) -> torch.Tensor:
    """Routed (token, id) counts per MoE layer and expert over valid rows: int64 ``[M, E]``."""
    import torch

    meta = batch.meta
    M, E = len(meta.moe_slots), meta.num_experts
    slots = torch.tensor(meta.moe_slots, device=batch.values_NLK.device)
    ids_VMK = batch.values_NLK.index_select(1, slots)[batch.valid_N].to(torch.int64)
    flat = ids_VMK + (torch.arange(M, device=ids_VMK.device) * E)[None, :, None]
    return torch.bincount(flat.reshape(-1), minlength=M * E).reshape(M, E).cpu()


def load_bars(load_E: list[int]) -> str:
    """One line per layer: experts bucketed into at most 64 columns, bar height = share of max."""
    E = len(load_E)
    per = -(-E // _COLUMNS)
    buckets = [sum(load_E[i : i + per]) for i in range(0, E, per)]
    top = max(buckets) or 1
    return "".join(_BARS[round(b / top * (len(_BARS) - 1))] for b in buckets)


def _summary(header: RecordHeader, batch: RouteBatch, payload: int) -> dict[str, Any]:
    from rr_core.codecs.encoding import CODECS, bytes_per_token

    m = header.meta
    valid = int(batch.valid_N.sum())
    load = expert_load(batch)
    mean = load.sum(1).clamp(min=1) / m.num_experts
    return {
        "file": str(header.path),
        "codec": header.codec,
        "num_experts": m.num_experts,
        "top_k": m.top_k,
        "layer_axis": m.layer_axis,
        "layer_numbers": list(m.layer_numbers),
        "moe_layer_numbers": list(m.routed_layer_numbers),
        "sequences": batch.num_sequences,
        "rows": batch.num_tokens,
        "valid_rows": valid,
        "valid_share": valid / batch.num_tokens if batch.num_tokens else 0.0,
        "payload_bytes": payload,
        "bytes_per_valid_token": payload / valid if valid else 0.0,
        "bytes_per_token_by_codec": {c: bytes_per_token(m, c) for c in CODECS},
        "producer": header.producer,
        "checksum": header.checksum,
        "expert_load": load.tolist(),
        "max_over_mean_load": (load.max(1).values / mean).tolist(),
    }


def _inspect(args: argparse.Namespace) -> int:
    from rr_core.errors import RRError
    from rr_core.records.file import load_routes, read_record

    try:
        header, enc = read_record(args.file)
        batch = load_routes(args.file)
    except RRError as exc:
        print(f"rr inspect: {exc}", file=sys.stderr)
        return 1
    info = _summary(header, batch, enc.payload.numel())
    if args.plot:
        code = _plot(info, Path(args.plot))
        if code:
            return code
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    moe = info["moe_layer_numbers"]
    print(f"{info['file']}")
    print(
        f"  codec {info['codec']}, E={info['num_experts']}, top-k={info['top_k']}, axis "
        f"{info['layer_axis']} ({len(info['layer_numbers'])} slots, {len(moe)} MoE)"
    )
    print(
        f"  {info['sequences']} sequences, {info['rows']} rows, {info['valid_rows']} valid "
        f"({info['valid_share']:.1%})"
    )
    per_codec = ", ".join(f"{c} {b:g}" for c, b in info["bytes_per_token_by_codec"].items())
    print(
        f"  payload {info['payload_bytes']} bytes, {info['bytes_per_valid_token']:.2f} per "
        f"valid token (+1/8 validity per row); per codec: {per_codec}"
    )
    print(f"  producer {json.dumps(info['producer'], sort_keys=True)}")
    print(
        "  expert load per MoE layer (max/mean, then one column per "
        f"{-(-info['num_experts'] // _COLUMNS)} experts):"
    )
    for layer, load_E, ratio in zip(
        moe, info["expert_load"], info["max_over_mean_load"], strict=True
    ):
        print(f"  {layer:>5} {ratio:5.2f} |{load_bars(load_E)}|")
    return 0


def _plot(info: dict[str, Any], out: Path) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("rr inspect --plot needs matplotlib: pip install 'rr-core[plot]'", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(10, 1 + 0.12 * len(info["expert_load"])))
    image = ax.imshow(info["expert_load"], aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("expert id")
    ax.set_ylabel("MoE layer (ordinal)")
    ax.set_title(f"{Path(info['file']).name}: routed tokens per expert")
    fig.colorbar(image, ax=ax, label="tokens")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return 0


def _convert(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from rr_core.codecs.encoding import (
        EncodedRoutes,
        check_codec,
        decode_routes,
        encode_payload,
        pack_valid,
    )
    from rr_core.errors import RRError
    from rr_core.records.file import read_record, save_routes

    try:
        codec = check_codec(args.codec)
        header, enc = read_record(args.input)
        batch = decode_routes(enc)
        meta = batch.meta
        moe = torch.tensor(meta.moe_slots)
        rows_VMK = batch.values_NLK.index_select(1, moe)[batch.valid_N]
        step = max(8, (args.chunk_rows // 8) * 8)  # whole bytes per chunk of fields
        chunks = []
        for start in tqdm(
            range(0, rows_VMK.shape[0], step),
            desc="convert",
            unit="chunk",
            disable=False if args.progress else None,
        ):
            chunks.append(encode_payload(rows_VMK[start : start + step], codec, meta))
        out = EncodedRoutes(
            codec=codec,
            meta=meta,
            num_rows=batch.num_tokens,
            offsets_B1=batch.offsets_B1,
            valid_bits=pack_valid(batch.valid_N),
            payload=torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8),
        )
        save_routes(
            args.output,
            out,
            sample_ids=header.sample_ids,
            producer={**header.producer, "converted_from": header.codec},
        )
    except RRError as exc:
        print(f"rr convert: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.output}: {header.codec} -> {codec}, {enc.payload.numel()} -> "
        f"{out.payload.numel()} payload bytes"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from rr_core.errors import RRError
    from rr_core.records.file import load_routes
    from rr_core.records.shards import RouteIndex

    path = Path(args.file)
    try:
        files = RouteIndex(path).shard_files() if path.suffix == ".json" else [path]
        if path.suffix == ".json":
            index = RouteIndex(path)
            index.load(index.sample_ids)
        for f in files:
            load_routes(f).validate(allow_all_zero=args.allow_all_zero)
    except RRError as exc:
        print(f"FAIL {path}: {exc}", file=sys.stderr)
        return 1
    print(f"OK {path}" + (f" ({len(files)} shards)" if path.suffix == ".json" else ""))
    return 0


def register_inspect(commands: Any) -> None:
    """Add ``rr inspect`` (entry point ``rr.commands``)."""
    p = commands.add_parser("inspect", help="describe a route record file")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw the per-layer expert-load heat map")
    p.set_defaults(func=_inspect)


def register_convert(commands: Any) -> None:
    """Add ``rr convert`` (entry point ``rr.commands``)."""
    p = commands.add_parser("convert", help="re-encode a route record with another codec")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--codec", required=True, help="raw, packed or set (set loses id order)")
    p.add_argument("--chunk-rows", type=int, default=1 << 16, help="valid rows per step")
    p.add_argument("--progress", action="store_true", help="show the progress bar off a tty too")
    p.set_defaults(func=_convert)


def register_verify(commands: Any) -> None:
    """Add ``rr verify`` (entry point ``rr.commands``)."""
    p = commands.add_parser("verify", help="check a record file or index (exit 0 ok, 1 bad)")
    p.add_argument("file", help="a record file, or an index.json to check every shard")
    p.add_argument(
        "--allow-all-zero",
        action="store_true",
        help="accept MoE layers that are zero on every valid row",
    )
    p.set_defaults(func=_verify)
