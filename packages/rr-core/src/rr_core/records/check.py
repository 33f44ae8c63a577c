"""The invariants between a record file's metadata and its tensors, checked on every read.

A checksum proves that the bytes are the ones written, not that the writer was right: a buggy or
foreign writer can produce a well-checksummed file whose metadata contradicts its tensors. Each
check here names the field, the value found and the value expected, so such a file is refused
instead of decoded into routes it never held. Metadata is parsed strictly (canonical integers,
JSON lists of integers, no booleans), so that a file decodes only into what it says.

Shape legend: B sequences, N rows, V valid rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rr_core.codecs.encoding import CODECS, field_bits, payload_bytes
from rr_core.errors import RecordFileError, RRError
from rr_core.records.provenance import read_provenance
from rr_core.routes.meta import RouteMeta

FORMAT = "rr-routes"
FORMAT_VERSION = "2"
#: Versions this rr-core reads: 1 (no provenance), 2 (provenance, rr_core.records.provenance).
READ_VERSIONS = ("1", "2")
TENSORS = {"payload": "U8", "valid_bits": "U8", "offsets": "I64"}  # safetensors dtype names
KEYS = (
    "rr.format",
    "rr.format_version",
    "codec",
    "num_experts",
    "top_k",
    "layer_axis",
    "layer_numbers",
    "moe_layer_numbers",
    "num_rows",
    "sample_ids",
    "producer",
    "checksum",
)
#: Keys a version adds to KEYS.
KEYS_SINCE = {"2": ("provenance",)}
# Far above any model (hundreds of experts, top-k in the tens, about a hundred layers), low
# enough that a hostile header cannot make sizing the payload or decoding it take unbounded time.
MAX_EXPERTS = (1 << 31) - 1  # ids are held in int32 at most
MAX_TOP_K = 4096
MAX_LAYERS = 4096
_UINT = re.compile(r"0|[1-9][0-9]{0,17}")


def _bad(path: Path, field: str, found: object, expected: str) -> RecordFileError:
    return RecordFileError(
        f"{path}: metadata {field} is {found!r}, expected {expected}; the writer of this file is "
        "broken or not rr: rewrite it with rr_core.save_routes"
    )


def _uint(path: Path, md: Mapping[str, str], key: str, high: int) -> int:
    text = md[key]
    if not _UINT.fullmatch(text) or int(text) > high:
        raise _bad(path, key, text, f"a decimal integer in [0, {high}]")
    return int(text)


def _json(path: Path, md: Mapping[str, str], key: str) -> Any:
    try:
        return json.loads(md[key])
    except ValueError:
        raise _bad(path, key, md[key], "JSON") from None


def _int_list(path: Path, key: str, value: Any, expected: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise _bad(path, key, value, expected)
    if len(value) > MAX_LAYERS:
        raise _bad(path, key, f"a list of {len(value)}", f"at most {MAX_LAYERS} layers")
    return tuple(value)


def _present(path: Path, md: Mapping[str, Any], key: str) -> None:
    if key not in md:
        raise _bad(path, key, None, "present (every rr record file of its version has it)")
    if not isinstance(md[key], str):
        raise _bad(path, key, md[key], "a string")


def check_metadata(path: Path, md: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed fields of a record's metadata; raises naming the first bad field."""
    if md.get("rr.format") != FORMAT:
        raise RecordFileError(
            f"{path}: not an rr record file (its metadata has rr.format="
            f"{md.get('rr.format')!r}, expected {FORMAT!r})"
        )
    for key in KEYS:
        _present(path, md, key)
    version = md["rr.format_version"]
    if version not in READ_VERSIONS:
        raise RecordFileError(
            f"{path}: record format version {version!r}; this rr-core reads versions "
            f"{', '.join(READ_VERSIONS)}: upgrade rr-core"
        )
    for since, keys in KEYS_SINCE.items():
        for key in keys if int(version) >= int(since) else ():
            _present(path, md, key)
    codec = md["codec"]
    if codec not in CODECS:
        raise _bad(path, "codec", codec, f"one of {', '.join(CODECS)}")
    E = _uint(path, md, "num_experts", MAX_EXPERTS)
    K = _uint(path, md, "top_k", min(E, MAX_TOP_K))
    layers = _int_list(path, "layer_numbers", _json(path, md, "layer_numbers"), "a list of ints")
    moe_raw = _json(path, md, "moe_layer_numbers")
    moe = None if moe_raw is None else _int_list(path, "moe_layer_numbers", moe_raw, "null or ints")
    try:
        meta = RouteMeta(
            num_experts=E,
            top_k=K,
            layer_axis=md["layer_axis"],  # checked by RouteMeta
            layer_numbers=layers,
            moe_layer_numbers=moe,
        )
    except RRError as exc:
        raise RecordFileError(f"{path}: metadata describes no valid layout: {exc}") from exc
    ids = _json(path, md, "sample_ids")
    if not isinstance(ids, list) or any(
        isinstance(s, bool) or not isinstance(s, int | str) for s in ids
    ):
        raise _bad(path, "sample_ids", md["sample_ids"], "a JSON list of ints or strings")
    if len(set(ids)) != len(ids):
        raise _bad(path, "sample_ids", md["sample_ids"], "ids that do not repeat")
    producer = _json(path, md, "producer")
    if not isinstance(producer, dict) or not all(isinstance(v, str) for v in producer.values()):
        raise _bad(path, "producer", md["producer"], "a JSON object of strings")
    return {
        "codec": codec,
        "meta": meta,
        "num_rows": _uint(path, md, "num_rows", 1 << 62),
        "sample_ids": tuple(ids),
        "producer": producer,
        "provenance": read_provenance(path, md["provenance"]) if "provenance" in md else {},
        "checksum": md["checksum"],
    }


def check_entries(path: Path, header: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    """The tensor entries of the safetensors header agree with the parsed metadata: names,
    dtypes, 1-D shapes, ``offsets`` of ``len(sample_ids) + 1``, ``valid_bits`` of one bit per
    row, and a payload no longer than every row valid would need."""
    names = sorted(k for k in header if k != "__metadata__")
    if names != sorted(TENSORS):
        raise RecordFileError(f"{path}: holds tensors {names}, expected {sorted(TENSORS)}")
    for name, dtype in TENSORS.items():
        entry = header[name]
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("dtype") != dtype:
            found = entry.get("dtype") if isinstance(entry, dict) else entry
            raise RecordFileError(
                f"{path}: tensor {name} has dtype {found!r}, expected {dtype} "
                f"({'uint8' if dtype == 'U8' else 'int64'})"
            )
        if not isinstance(shape, list) or len(shape) != 1 or type(shape[0]) is not int:
            raise RecordFileError(f"{path}: tensor {name} has shape {shape!r}, expected 1-D")
    meta, rows, B = fields["meta"], fields["num_rows"], len(fields["sample_ids"])
    _expect(path, "offsets", "elements", header["offsets"]["shape"][0], B + 1, "len(sample_ids)+1")
    bits = -(-rows // 8)
    _expect(path, "valid_bits", "bytes", header["valid_bits"]["shape"][0], bits, "num_rows/8")
    most = payload_bytes(meta, fields["codec"], rows)
    if header["payload"]["shape"][0] > most:
        raise RecordFileError(
            f"{path}: tensor payload has {header['payload']['shape'][0]} bytes, expected at most "
            f"{most} (codec {fields['codec']}, {rows} rows all valid)"
        )


def _expect(path: Path, name: str, unit: str, found: int, expected: int, why: str) -> None:
    if found != expected:
        raise RecordFileError(
            f"{path}: tensor {name} has {found} {unit}, expected {expected} ({why}, from the "
            "metadata)"
        )


def check_tensors(
    path: Path, fields: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
) -> int:
    """The tensors agree with the metadata: offsets start at 0, never decrease and end at
    ``num_rows``; validity bits past the last row are clear; the payload has exactly the bytes
    the codec needs for the valid rows. Returns the valid row count."""
    rows = fields["num_rows"]
    offsets_B1 = tensors["offsets"]
    if int(offsets_B1[0]) != 0 or int(offsets_B1[-1]) != rows:
        raise RecordFileError(
            f"{path}: tensor offsets runs from {int(offsets_B1[0])} to {int(offsets_B1[-1])}, "
            f"expected 0 to num_rows={rows}"
        )
    steps = offsets_B1.diff()
    if bool((steps < 0).any()):
        b = int((steps < 0).nonzero()[0, 0])
        raise RecordFileError(
            f"{path}: tensor offsets decreases at sequence {b} ({int(offsets_B1[b])} -> "
            f"{int(offsets_B1[b + 1])}), expected non-decreasing offsets"
        )
    bits = tensors["valid_bits"]
    if rows % 8 and int(bits[-1]) >> (rows % 8):
        raise RecordFileError(
            f"{path}: tensor valid_bits marks rows past num_rows={rows} valid (last byte "
            f"{int(bits[-1]):#04x}), expected those bits clear"
        )
    valid = _popcount(bits)
    meta, codec, payload = fields["meta"], fields["codec"], tensors["payload"]
    need = payload_bytes(meta, codec, valid)
    _expect(path, "payload", "bytes", payload.numel(), need, f"{valid} valid rows")
    used = valid * len(meta.moe_slots) * field_bits(meta, codec) % 8
    if codec != "raw" and used and int(payload[-1]) >> used:
        raise RecordFileError(
            f"{path}: tensor payload has bits set past its last field (last byte "
            f"{int(payload[-1]):#04x}, fields use its low {used} bits), expected those bits clear"
        )
    return valid


def _popcount(bits: torch.Tensor) -> int:
    table = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)
    return int(table[bits.to(torch.int64)].sum())


def check_sample_ids(sample_ids: Sequence[Any], count: int) -> list[Any]:
    """Writer-side: ``count`` unique int or str ids (bools are not ids)."""
    ids = list(sample_ids)
    if len(ids) != count:
        raise RecordFileError(f"{len(ids)} sample ids for a batch of {count} sequences")
    if any(isinstance(s, bool) or not isinstance(s, int | str) for s in ids):
        raise RecordFileError(
            f"sample ids must be ints or strings; got {sorted({type(s).__name__ for s in ids})}"
        )
    if len(set(ids)) != count:
        raise RecordFileError("sample ids repeat; each sequence needs its own id")
    return ids
