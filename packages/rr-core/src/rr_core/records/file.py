"""Record files: one encoded route batch and its metadata in a checksummed safetensors file.

Tensors: ``payload`` (uint8), ``valid_bits`` (uint8, one bit per row) and ``offsets`` (int64
``[B+1]``). Metadata (safetensors strings): ``rr.format``, ``rr.format_version``, ``codec``,
``num_experts``, ``top_k``, ``layer_axis``, ``layer_numbers`` and ``moe_layer_numbers`` (JSON),
``num_rows``, ``sample_ids`` (JSON list of ints or strings, one per sequence), ``producer``
(JSON object of versions), ``provenance`` (JSON object: the engine, its release and the
settings that decide whether its routes replay exactly; :mod:`rr_core.records.provenance`;
format version 2, absent from version-1 files, which still read) and ``checksum``:
``sha256:<hex>`` over the other metadata and every tensor's name, dtype, shape and bytes.
Every read verifies it, so a flipped bit anywhere in the file raises :class:`RecordFileError`
naming the file, never yields different routes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from rr_core.checks import describe
from rr_core.codecs.encoding import DEFAULT_CODEC, EncodedRoutes, decode_routes, encode_routes
from rr_core.errors import RecordFileError, RRError
from rr_core.records.atomic import as_path, atomic_write
from rr_core.records.check import (
    FORMAT,
    FORMAT_VERSION,
    check_entries,
    check_metadata,
    check_sample_ids,
    check_tensors,
)
from rr_core.records.provenance import provenance_json
from rr_core.routes.batch import RouteBatch
from rr_core.routes.meta import RouteMeta

SampleId = int | str
PathLike = str | os.PathLike[str]
_TENSORS = ("payload", "valid_bits", "offsets")
MAX_HEADER_BYTES = 16 << 20  # real headers are about 600 bytes; sample ids of 10^5 sequences fit


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
    provenance: dict[str, Any] = field(default_factory=dict)
    checksum: str = ""


def _checksum(metadata: Mapping[str, str], tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    rest = {k: v for k, v in metadata.items() if k != "checksum"}
    h.update(json.dumps(rest, sort_keys=True).encode())
    for name in _TENSORS:
        t = tensors[name].contiguous().cpu()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"sha256:{h.hexdigest()}"


def _sample_ids(sample_ids: Sequence[SampleId] | None, count: int) -> list[SampleId]:
    return check_sample_ids(range(count) if sample_ids is None else sample_ids, count)


def producer_fields(producer: object) -> dict[str, str]:
    """``producer`` (None, or a mapping of strings to strings) as a plain dict."""
    if producer is not None and not isinstance(producer, Mapping):
        raise RecordFileError(f"producer must be a mapping of strings; got {describe(producer)}")
    extra = dict(producer or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        raise RecordFileError(
            f"producer must map strings to strings; got {extra!r} (write numbers with str())"
        )
    return extra


def save_routes(
    path: PathLike,
    routes: RouteBatch | EncodedRoutes,
    *,
    codec: str = DEFAULT_CODEC,
    sample_ids: Sequence[SampleId] | None = None,
    producer: Mapping[str, str] | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``routes`` (encoded with ``codec`` unless already encoded) to ``path`` atomically.

    ``sample_ids`` name the sequences (default ``0..B-1``); ``producer`` adds to the versions of
    :func:`producer_versions`; ``provenance`` records where the routes came from (the engine,
    its release, routing precision, speculative mode, prefix caching, id dtype: see
    :data:`rr_core.records.provenance.PROVENANCE_KEYS`).
    """
    from safetensors.torch import save

    target = as_path(path)
    if not isinstance(routes, RouteBatch | EncodedRoutes):
        raise RecordFileError(
            "save_routes takes a RouteBatch or the EncodedRoutes encode_routes returns; got "
            f"{describe(routes)}"
        )
    extra = producer_fields(producer)
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
        "producer": json.dumps({**producer_versions(), **extra}, sort_keys=True),
        "provenance": provenance_json(provenance, str(path)),
    }
    tensors = {
        "payload": enc.payload.contiguous().cpu(),
        "valid_bits": enc.valid_bits.contiguous().cpu(),
        "offsets": enc.offsets_B1.contiguous().cpu(),
    }
    metadata["checksum"] = _checksum(metadata, tensors)
    # The reader's checks, run before writing: rr never writes a file it would refuse to read.
    fields = check_metadata(target, metadata)
    check_entries(target, _entries(tensors), fields)
    check_tensors(target, fields, tensors)
    directory = target.parent
    if not directory.is_dir():
        raise RecordFileError(
            f"{directory}: no such directory to write {target.name} into; create it first"
        )
    data = save(tensors, metadata=metadata)
    _check_header_size(target, int.from_bytes(data[:8], "little"), metadata)
    return atomic_write(target, data)


def _check_header_size(path: Path, size: int, metadata: Mapping[str, str]) -> None:
    """The reader's header limit, at write time: a header over it would be written and then
    refused by every reader, its routes lost."""
    if size <= MAX_HEADER_BYTES:
        return
    largest = sorted(metadata, key=lambda k: len(metadata[k]), reverse=True)[:2]
    sizes = ", ".join(f"{k} {len(metadata[k])} bytes" for k in largest)
    raise RecordFileError(
        f"{path}: the record's header would be {size} bytes, over the {MAX_HEADER_BYTES >> 20} "
        f"MiB a reader accepts (largest fields: {sizes}); write fewer sequences per record "
        "(shards: rr_core.write_shard), shorter sample ids, or a smaller provenance"
    )


def _entries(tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    names = {torch.uint8: "U8", torch.int64: "I64"}
    return {
        k: {"dtype": names.get(t.dtype, str(t.dtype)), "shape": list(t.shape)}
        for k, t in tensors.items()
    }


def _header(path: Path, fields: Mapping[str, Any]) -> RecordHeader:
    return RecordHeader(path=path, **fields)


def _read_header_json(path: Path, f: BinaryIO, size: int) -> dict[str, Any]:
    """The JSON of the safetensors header, read only after its length is checked."""
    head = f.read(8)
    if len(head) < 8:
        raise RecordFileError(f"{path}: truncated ({size} bytes; a record starts with 8)")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES:
        raise RecordFileError(
            f"{path}: not an rr record file (or its first 8 bytes are corrupt): they declare a "
            f"{n}-byte header, and a record's header is at most {MAX_HEADER_BYTES >> 20} MiB"
        )
    if 8 + n > size:
        raise RecordFileError(
            f"{path}: truncated or corrupt: its header claims {n} bytes, the file has {size}"
        )
    text = f.read(n)
    if not text.startswith(b"{"):
        raise RecordFileError(f"{path}: not an rr record file (no safetensors header)")
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise RecordFileError(f"{path}: corrupt header ({exc})") from exc
    if not isinstance(header, dict):
        raise RecordFileError(f"{path}: not an rr record file (no safetensors header)")
    md = header.get("__metadata__")
    if not isinstance(md, dict) or "rr.format" not in md:
        raise RecordFileError(
            f"{path}: not an rr record file (a safetensors file without rr metadata)"
        )
    return header


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as exc:
        raise RecordFileError(f"{path}: cannot read ({exc.strerror})") from exc


def read_header(path: PathLike) -> RecordHeader:
    """The metadata of a record file, reading only its header (the checksum is not verified:
    use :func:`read_record` or :func:`load_routes` for the routes themselves). The metadata and
    the tensor shapes it implies are checked (see :mod:`rr_core.records.check`)."""
    p = as_path(path)
    with _open(p) as f:
        try:
            header = _read_header_json(p, f, os.fstat(f.fileno()).st_size)
        except OSError as exc:
            raise RecordFileError(f"{p}: cannot read ({exc.strerror})") from exc
    fields = check_metadata(p, header["__metadata__"])
    check_entries(p, header, fields)
    return _header(p, fields)


def read_record(path: PathLike) -> tuple[RecordHeader, EncodedRoutes]:
    """Header and encoded routes of a record file, checksum and every invariant between metadata
    and tensors verified; nothing is decoded."""
    from safetensors.torch import load

    p = as_path(path)
    with _open(p) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            header = _read_header_json(p, f, size)
            f.seek(0)
            data = f.read()
        except OSError as exc:
            raise RecordFileError(f"{p}: cannot read ({exc.strerror})") from exc
    md = header["__metadata__"]
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types for every malformed layout
        raise RecordFileError(f"{p}: truncated or corrupt ({exc})") from exc
    if sorted(tensors) != sorted(_TENSORS):
        raise RecordFileError(f"{p}: holds tensors {sorted(tensors)}, expected {list(_TENSORS)}")
    if _checksum(md, tensors) != md.get("checksum"):
        raise RecordFileError(
            f"{p}: checksum mismatch: the file is corrupt (recorded {md.get('checksum')!r})"
        )
    # A matching checksum proves only that these are the bytes written: check what they say.
    fields = check_metadata(p, md)
    check_entries(p, header, fields)
    check_tensors(p, fields, tensors)
    enc = EncodedRoutes(
        codec=fields["codec"],
        meta=fields["meta"],
        num_rows=fields["num_rows"],
        offsets_B1=tensors["offsets"],
        valid_bits=tensors["valid_bits"],
        payload=tensors["payload"],
    )
    return _header(p, fields), enc


def load_routes(path: PathLike, *, device: torch.device | str | None = None) -> RouteBatch:
    """The route batch of a record file on ``device``, checksum verified; malformed contents
    raise :class:`RecordFileError` naming the file."""
    p = as_path(path)
    _, enc = read_record(p)
    return decode_record(p, enc, device)


def decode_record(
    path: Path, enc: EncodedRoutes, device: torch.device | str | None = None
) -> RouteBatch:
    """:func:`decode_routes` of a record read from ``path``, every failure a RecordFileError."""
    try:
        return decode_routes(enc, device=device)
    except RRError as exc:
        raise RecordFileError(f"{path}: {exc}") from exc
    except (RuntimeError, MemoryError) as exc:  # an allocation the machine cannot make
        m = enc.meta
        raise RecordFileError(
            f"{path}: cannot decode {enc.num_rows} rows x {len(m.layer_numbers)} layer slots x "
            f"top-{m.top_k} on {device or 'cpu'} ({type(exc).__name__}: {str(exc)[:200]}); "
            "read it on a machine with more memory, or split the batch when writing"
        ) from exc
