"""Record files: one encoded route batch and its metadata in a checksummed safetensors file.

Tensors: ``payload`` (uint8), ``valid_bits`` (uint8, one bit per row) and ``offsets`` (int64
``[B+1]``). Metadata (safetensors strings): ``rr.format``, ``rr.format_version``, ``codec``,
``num_experts``, ``top_k``, ``layer_axis``, ``layer_numbers`` and ``moe_layer_numbers`` (JSON),
``num_rows``, ``sample_ids`` (JSON list of ints or strings, one per sequence), ``producer``
(JSON object of versions) and ``checksum``: ``sha256:<hex>`` over the other metadata and every
tensor's name, dtype, shape and bytes. Every read verifies it, so a flipped bit anywhere in the
file raises :class:`RecordFileError` naming the file, never yields different routes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rr_core.codecs.encoding import DEFAULT_CODEC, EncodedRoutes, decode_routes, encode_routes
from rr_core.errors import RecordFileError, RRError
from rr_core.records.atomic import atomic_write
from rr_core.routes.batch import RouteBatch, RouteMeta

FORMAT = "rr-routes"
FORMAT_VERSION = "1"
SampleId = int | str
PathLike = str | os.PathLike[str]
_TENSORS = ("payload", "valid_bits", "offsets")
_MAX_HEADER = 1 << 30


def producer_versions() -> dict[str, str]:
    """Versions recorded in every file by default: rr-core, torch, python."""
    from rr_core import __version__

    return {"rr-core": __version__, "torch": torch.__version__, "python": platform.python_version()}


@dataclass(frozen=True, kw_only=True)
class RecordHeader:
    """What a record file says about itself, read without its payload."""

    path: Path
    codec: str
    meta: RouteMeta
    num_rows: int
    sample_ids: tuple[SampleId, ...]
    producer: dict[str, str] = field(default_factory=dict)
    checksum: str = ""


def _checksum(metadata: Mapping[str, str], tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    rest = {k: v for k, v in metadata.items() if k != "checksum"}
    h.update(json.dumps(rest, sort_keys=True).encode())
    for name in _TENSORS:
        t = tensors[name].contiguous().cpu()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"sha256:{h.hexdigest()}"


def _sample_ids(sample_ids: Sequence[SampleId] | None, count: int) -> list[SampleId]:
    ids: list[SampleId] = list(range(count)) if sample_ids is None else list(sample_ids)
    if len(ids) != count:
        raise RecordFileError(f"{len(ids)} sample ids for a batch of {count} sequences")
    if any(isinstance(s, bool) or not isinstance(s, int | str) for s in ids):
        raise RecordFileError("sample ids must be ints or strings")
    if len(set(ids)) != count:
        raise RecordFileError("sample ids repeat; each sequence needs its own id")
    return ids


def save_routes(
    path: PathLike,
    routes: RouteBatch | EncodedRoutes,
    *,
    codec: str = DEFAULT_CODEC,
    sample_ids: Sequence[SampleId] | None = None,
    producer: Mapping[str, str] | None = None,
) -> Path:
    """Write ``routes`` (encoded with ``codec`` unless already encoded) to ``path`` atomically.

    ``sample_ids`` name the sequences (default ``0..B-1``); ``producer`` adds to the versions of
    :func:`producer_versions`.
    """
    from safetensors.torch import save

    enc = encode_routes(routes, codec) if isinstance(routes, RouteBatch) else routes
    m = enc.meta
    metadata = {
        "rr.format": FORMAT,
        "rr.format_version": FORMAT_VERSION,
        "codec": enc.codec,
        "num_experts": str(m.num_experts),
        "top_k": str(m.top_k),
        "layer_axis": m.layer_axis,
        "layer_numbers": json.dumps(list(m.layer_numbers)),
        "moe_layer_numbers": json.dumps(
            None if m.moe_layer_numbers is None else list(m.moe_layer_numbers)
        ),
        "num_rows": str(enc.num_rows),
        "sample_ids": json.dumps(_sample_ids(sample_ids, enc.offsets_B1.numel() - 1)),
        "producer": json.dumps({**producer_versions(), **(producer or {})}, sort_keys=True),
    }
    tensors = {
        "payload": enc.payload.contiguous().cpu(),
        "valid_bits": enc.valid_bits.contiguous().cpu(),
        "offsets": enc.offsets_B1.contiguous().cpu(),
    }
    metadata["checksum"] = _checksum(metadata, tensors)
    return atomic_write(path, save(tensors, metadata=metadata))


def _header_from_metadata(path: Path, md: Mapping[str, str]) -> RecordHeader:
    try:
        if md.get("rr.format") != FORMAT:
            raise RecordFileError(f"{path}: not an rr route record (rr.format is missing)")
        if md["rr.format_version"] != FORMAT_VERSION:
            raise RecordFileError(
                f"{path}: record format version {md['rr.format_version']}; this rr-core reads "
                f"version {FORMAT_VERSION}: upgrade rr-core"
            )
        moe = json.loads(md["moe_layer_numbers"])
        meta = RouteMeta(
            num_experts=int(md["num_experts"]),
            top_k=int(md["top_k"]),
            layer_axis=md["layer_axis"],  # type: ignore[arg-type]  # checked by RouteMeta
            layer_numbers=tuple(json.loads(md["layer_numbers"])),
            moe_layer_numbers=None if moe is None else tuple(moe),
        )
        return RecordHeader(
            path=path,
            codec=md["codec"],
            meta=meta,
            num_rows=int(md["num_rows"]),
            sample_ids=tuple(json.loads(md["sample_ids"])),
            producer=dict(json.loads(md["producer"])),
            checksum=md["checksum"],
        )
    except RecordFileError:
        raise
    except (KeyError, ValueError, TypeError, RRError) as exc:
        raise RecordFileError(
            f"{path}: corrupt record metadata ({type(exc).__name__}: {exc})"
        ) from exc


def _parse_header(path: Path, head: bytes, size: int) -> tuple[int, dict[str, Any]]:
    if len(head) < 8:
        raise RecordFileError(f"{path}: truncated ({size} bytes; a record starts with 8)")
    n = int.from_bytes(head[:8], "little")
    if n > _MAX_HEADER or 8 + n > size:
        raise RecordFileError(
            f"{path}: truncated or corrupt: its header claims {n} bytes, the file has {size}"
        )
    try:
        header = json.loads(head[8 : 8 + n])
        md = header.pop("__metadata__")
    except (ValueError, KeyError, AttributeError) as exc:
        raise RecordFileError(f"{path}: corrupt header ({exc})") from exc
    if not isinstance(md, dict):
        raise RecordFileError(f"{path}: corrupt header (metadata is not an object)")
    return n, md


def read_header(path: PathLike) -> RecordHeader:
    """The metadata of a record file, reading only its header (the checksum is not verified:
    use :func:`read_record` or :func:`load_routes` for the routes themselves)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) == 8:
                head += f.read(min(int.from_bytes(head, "little"), _MAX_HEADER))
    except OSError as exc:
        raise RecordFileError(f"{p}: cannot read ({exc.strerror})") from exc
    _, md = _parse_header(p, head, size)
    return _header_from_metadata(p, md)


def read_record(path: PathLike) -> tuple[RecordHeader, EncodedRoutes]:
    """Header and encoded routes of a record file, checksum verified; nothing is decoded."""
    from safetensors.torch import load

    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise RecordFileError(f"{p}: cannot read ({exc.strerror})") from exc
    _, md = _parse_header(p, data, len(data))
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types for every malformed layout
        raise RecordFileError(f"{p}: truncated or corrupt ({exc})") from exc
    if set(tensors) != set(_TENSORS):
        raise RecordFileError(f"{p}: holds tensors {sorted(tensors)}, expected {list(_TENSORS)}")
    if _checksum(md, tensors) != md.get("checksum"):
        raise RecordFileError(
            f"{p}: checksum mismatch: the file is corrupt (recorded {md.get('checksum')!r})"
        )
    header = _header_from_metadata(p, md)
    enc = EncodedRoutes(
        codec=header.codec,  # type: ignore[arg-type]  # checked when decoded
        meta=header.meta,
        num_rows=header.num_rows,
        offsets_B1=tensors["offsets"],
        valid_bits=tensors["valid_bits"],
        payload=tensors["payload"],
    )
    return header, enc


def load_routes(path: PathLike, *, device: torch.device | str | None = None) -> RouteBatch:
    """The route batch of a record file on ``device``, checksum verified; malformed contents
    raise :class:`RecordFileError` naming the file."""
    p = Path(path)
    _, enc = read_record(p)
    try:
        return decode_routes(enc, device=device)
    except RRError as exc:
        raise RecordFileError(f"{p}: {exc}") from exc
