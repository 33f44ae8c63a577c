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

from rr_core.cli.plots import plot_problem

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
        "provenance": header.provenance,
        "checksum": header.checksum,
        "expert_load": load.tolist(),
        "max_over_mean_load": (load.max(1).values / mean).tolist(),
    }


def _inspect(args: argparse.Namespace) -> int:
    from rr_core.errors import RRError
    from rr_core.records.file import read_record

    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        problem = plot_problem(plot, install="rr-core[plot]")
        if problem:
            print(f"rr inspect: {problem}", file=sys.stderr)
            return 2
    from rr_core.codecs.encoding import decode_routes

    try:
        header, enc = read_record(args.file)
    except RRError as exc:
        print(f"rr inspect: {exc}", file=sys.stderr)
        return 1
    try:
        batch = decode_routes(enc)
    except RRError as exc:
        print(f"rr inspect: {args.file}: {exc}", file=sys.stderr)
        return 1
    info = _summary(header, batch, enc.payload.numel())
    if args.json:
        print(compact_json(info))
    else:
        _print_text(info)
    if plot is not None:
        sys.stdout.flush()  # the figures are on screen before the drawing starts
        try:
            _plot(info, plot)
        except OSError as exc:
            print(
                f"rr inspect: --plot {plot}: cannot write ({exc.strerror or exc})", file=sys.stderr
            )
            return 1
        print(f"wrote {plot}", file=sys.stderr)
    return 0


def compact_json(info: dict[str, Any]) -> str:
    """``info`` as JSON, one key per line and each list on one line (``expert_load``: one line
    per MoE layer), so that 128 experts x 48 layers stay readable."""
    lines = []
    for key, value in info.items():
        if key == "expert_load":
            rows = ",\n".join(f"  {json.dumps(row)}" for row in value)
            text = f"[\n{rows}\n ]" if value else "[]"
        else:
            text = json.dumps(value, sort_keys=isinstance(value, dict))
        lines.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}"


def _print_text(info: dict[str, Any]) -> None:
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
    provenance = info["provenance"]
    if provenance:
        settings = ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(provenance.items()))
        print(f"  provenance {settings}")
    else:
        print("  provenance not recorded (a version-1 file, or written without provenance=)")
    print(
        "  expert load per MoE layer (max/mean, then one column per "
        f"{-(-info['num_experts'] // _COLUMNS)} experts):"
    )
    for layer, load_E, ratio in zip(
        moe, info["expert_load"], info["max_over_mean_load"], strict=True
    ):
        print(f"  {layer:>5} {ratio:5.2f} |{load_bars(load_E)}|")


def _plot(info: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = info["moe_layer_numbers"]
    M = len(layers)
    fig, ax = plt.subplots(figsize=(10, max(3.0, 1.5 + 0.12 * M)))
    image = ax.imshow(info["expert_load"], aspect="auto", interpolation="nearest", cmap="viridis")
    step = max(1, -(-M // 24))  # at most about 24 labels, each a layer number
    ticks = list(range(0, M, step))
    ax.set_yticks(ticks, [str(layers[i]) for i in ticks])
    ax.set_xlabel("expert id")
    ax.set_ylabel("MoE layer number")
    ax.set_title(f"{Path(info['file']).name}: routed tokens per expert")
    fig.colorbar(image, ax=ax, label="tokens")
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


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

    out_dir = Path(args.output).parent
    if not out_dir.is_dir():
        print(
            f"rr convert: {out_dir}: no such directory to write into; create it first",
            file=sys.stderr,
        )
        return 1
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
            provenance=header.provenance,
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
    from rr_core.records.shards import INDEX_NAME

    path = Path(args.file)
    if args.clean:
        _clean(path)
    if path.is_dir():
        if (path / INDEX_NAME).is_file():
            return _verify_one(path / INDEX_NAME, args)
        files = sorted(
            p for p in path.iterdir() if p.suffix in _RECORD_SUFFIXES and not p.name.startswith(".")
        )
        if not files:
            print(
                f"FAIL {path}: no {INDEX_NAME} and no *.safetensors or *.rr files", file=sys.stderr
            )
            return 1
        return max(_verify_one(f, args) for f in files)
    return _verify_one(path, args)


_RECORD_SUFFIXES = (".safetensors", ".rr")


def _verify_one(path: Path, args: argparse.Namespace) -> int:
    from rr_core.errors import RRError
    from rr_core.records.file import load_routes
    from rr_core.records.shards import RouteIndex
    from rr_core.records.temps import parse_temp

    if parse_temp(path) is not None:
        print(
            f"FAIL {path}: a temporary file of an unfinished write, not a record "
            "(rr verify --clean removes those whose writer is gone)",
            file=sys.stderr,
        )
        return 1
    is_index = path.suffix == ".json"
    try:
        if is_index:
            index = RouteIndex(path)
            files = index.shard_files()
            index.load(index.sample_ids)
        else:
            files = [path]
        for f in files:
            load_routes(f).validate(allow_all_zero=args.allow_all_zero)
    except RRError as exc:
        message = str(exc).removeprefix(f"{path}: ")
        print(f"FAIL {path}: {message}", file=sys.stderr)
        return 1
    print(f"OK {path}" + (f" ({len(files)} shards)" if is_index else ""))
    return 0


def _clean(path: Path) -> None:
    """Remove the stale temporary files of ``path`` (a directory: of every file in it)."""
    from rr_core.records.temps import temp_files

    directory, name = (path, None) if path.is_dir() else (path.parent, path.name)
    try:
        found = temp_files(directory, name)
    except OSError as exc:
        print(f"rr verify --clean: {directory}: cannot list ({exc.strerror})", file=sys.stderr)
        return
    for t in found:
        if not t.stale():
            who = f"pid {t.pid}" if t.pid is not None else "its writer"
            print(f"kept {t.path} (a write in progress: {who} is running or wrote recently)")
            continue
        try:
            t.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            print(f"rr verify --clean: {t.path}: cannot remove ({exc.strerror})", file=sys.stderr)
            continue
        print(f"removed {t.path} (left by a writer that is gone)")


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


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
    p.add_argument("--chunk-rows", type=_positive, default=1 << 16, help="valid rows per step")
    p.add_argument("--progress", action="store_true", help="show the progress bar off a tty too")
    p.set_defaults(func=_convert)


def register_verify(commands: Any) -> None:
    """Add ``rr verify`` (entry point ``rr.commands``)."""
    p = commands.add_parser("verify", help="check a record file or index (exit 0 ok, 1 bad)")
    p.add_argument(
        "file",
        help="a record file, an index.json to check every shard, or a directory (its index.json, "
        "else its *.safetensors and *.rr files)",
    )
    p.add_argument(
        "--clean",
        action="store_true",
        help="first remove temporary files left by killed writers (never a running writer's)",
    )
    p.add_argument(
        "--allow-all-zero",
        action="store_true",
        help="accept MoE layers that are zero on every valid row",
    )
    p.set_defaults(func=_verify)
