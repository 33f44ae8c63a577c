"""The R3/v1 router-replay envelope, as hosted RL services put it in a trace's
``payloads.router_replay.data`` (format: eval-protocol/python-sdk PR #450, the deserializer and
its tests): base64 of zstd-compressed bytes; a 32-byte little-endian header (``<4sBBBBIIIIQ``:
magic ``R3V1``, version, selector mode 0 ALL / 1 SUFFIX / 2 BITMAP, id width 1 / 2, flags with
bit 0 little-endian, total tokens, replayed tokens, replay start, selector bytes, matrix bytes);
the selector (BITMAP only: bit ``i & 7`` of byte ``i >> 3``), then one ``[M, K]`` matrix per
replayed token, MoE layers only.

:func:`r3v1_raw` builds the uncompressed bytes (every header field can be overridden, for fault
tests), :func:`r3v1_wrap` compresses and base64-encodes them, :func:`r3v1_payload` does both.
"""

from __future__ import annotations

import base64
import importlib
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

HEADER = struct.Struct("<4sBBBBIIIIQ")
MODES = {"all": 0, "suffix": 1, "bitmap": 2}


def r3v1_raw(
    ids_TMK: np.ndarray,
    valid_T: Sequence[bool] | np.ndarray,
    *,
    selector: str | None = None,
    id_bytes: int | None = None,
    num_experts: int | None = None,
    **header: int | bytes,
) -> bytes:
    """Uncompressed R3/v1 bytes of the rows of ``ids_TMK`` (MoE columns) where ``valid_T``.

    ``selector`` defaults to the narrowest that describes ``valid_T`` (ALL, SUFFIX, else
    BITMAP), ``id_bytes`` to 1 when ``num_experts <= 256`` (without it: when every id fits
    uint8). ``header`` overrides fields by name: ``magic``, ``version``, ``mode``, ``width``,
    ``flags``, ``total``, ``replayed``, ``start``, ``selector_len``, ``matrix_len``.
    """
    ids = np.asarray(ids_TMK)
    valid = np.asarray(valid_T, dtype=bool)
    t = valid.size
    pos = np.flatnonzero(valid)
    if selector is None:
        contiguous = pos.size and pos[-1] - pos[0] + 1 == pos.size and pos[-1] == t - 1
        selector = "all" if pos.size == t else "suffix" if contiguous else "bitmap"
    if id_bytes is None:
        top = num_experts - 1 if num_experts is not None else int(ids.max()) if ids.size else 0
        id_bytes = 1 if top < 256 else 2
    sel = np.packbits(valid, bitorder="little").tobytes() if selector == "bitmap" else b""
    matrix = ids[pos].astype("<u1" if id_bytes == 1 else "<u2").tobytes()
    fields: dict[str, int | bytes] = {
        "magic": b"R3V1", "version": 1, "mode": MODES[selector], "width": id_bytes, "flags": 1,
        "total": t, "replayed": pos.size, "start": int(pos[0]) if selector == "suffix" else 0,
        "selector_len": len(sel), "matrix_len": len(matrix),
    }  # fmt: skip
    fields.update(header)
    return HEADER.pack(*fields.values()) + sel + matrix


def r3v1_wrap(raw: bytes, *, frames: int = 1) -> str:
    """zstd-compress ``raw`` (in ``frames`` concatenated frames) and base64-encode it."""
    zstd: Any = importlib.import_module("zstandard")
    step = -(-len(raw) // frames) if raw else 1
    chunks = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
    blob = b"".join(zstd.ZstdCompressor().compress(c) for c in chunks)
    return base64.b64encode(blob).decode("ascii")


def r3v1_payload(
    ids_TMK: np.ndarray, valid_T: Sequence[bool] | np.ndarray, **kw: Any
) -> dict[str, Any]:
    """A trace's ``payloads.router_replay``: manifest and base64 data."""
    frames = kw.pop("frames", 1)
    return {
        "manifest": {"PayloadVersion": "r3/v1", "Compression": "zstd"},
        "data": r3v1_wrap(r3v1_raw(ids_TMK, valid_T, **kw), frames=frames),
    }
