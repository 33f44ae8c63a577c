"""Decoding the R3/v1 router-replay envelope (hosted RL services' traces) into per-sample routes.

Shape legend: T tokens of the sample (``total_token_count``), R replayed tokens, L layer slots on
rr_core's ``all_layers`` axis, M MoE slots, K top-k.

The public description is eval-protocol/python-sdk PR #450 (``adapters/r3_deserializer.py`` and
its tests, merged 2026-05); each field below is as it states, unless marked *assumed*.

- The payload is base64 text of zstd-compressed bytes (a trace carries it as
  ``payloads.router_replay.data``, with ``manifest = {"PayloadVersion": "r3/v1",
  "Compression": "zstd"}``). Concatenated zstd frames are read as one stream (*assumed*: the
  producer may compress in chunks).
- A 32-byte little-endian header: magic ``b"R3V1"``; version ``u8`` (1); selector mode ``u8``
  (0 ALL, 1 SUFFIX, 2 BITMAP); routing dtype ``u8`` (1 uint8, 2 uint16, the byte width);
  flags ``u8`` (bit 0: little-endian ids); ``total_token_count``, ``replayed_token_count``,
  ``replay_start_token``, ``selector_byte_length`` as ``u32``; ``matrix_byte_length`` ``u64``.
- Then the selector bytes, then the matrix bytes: R per-token matrices of equal size, in token
  order. BITMAP: bit ``i & 7`` of byte ``i >> 3`` marks token ``i``; SUFFIX: tokens
  ``replay_start_token ..+ R``; ALL: every token.
- One token's matrix is ``num_moe_layers * top_k`` ids: MoE layers only, so rr lays it out at
  ``meta.moe_slots`` (layer-major, then top-k, *assumed*, as every engine's ``[.., M, K]``).
  The header carries neither M nor K: they come from ``meta``.

Stricter than that description, because a route must be exact or refused: the body must be
exactly header + selector + matrix (a truncated matrix is an error, never a partial result,
G10); a BITMAP is exactly ``ceil(T / 8)`` bytes with ``R`` bits set and no bit past ``T``; ALL
and SUFFIX carry no selector bytes, ALL starts at 0, a SUFFIX ends at the last token
(*assumed*); a payload that decompresses past what the sample's envelope can hold (header,
bitmap, uint16 ids of every token) is refused before more is read; unknown flag bits and a uint16
matrix without the little-endian bit are refused; no replayed token on a finished request is
missing routes (D3). Token ``i``'s matrix is its route as the input token, as in every engine
(*assumed*: the description does not say).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np

from rr_core import RouteMeta
from rr_vllm._supported import R3V1_EXTRA, R3V1_VERSIONS
from rr_vllm.decoded import DecodedRoutes, decoded_one
from rr_vllm.errors import EngineOutputError
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve
from rr_vllm.samples import SampleRoutes, sample_of, unrouted

MAGIC = b"R3V1"
HEADER = struct.Struct("<4sBBBBIIIIQ")  # 32 bytes
SELECTORS = {0: "all", 1: "suffix", 2: "bitmap"}
WIDTHS = {1: "<u1", 2: "<u2"}
LITTLE_ENDIAN = 0x01


@dataclass(frozen=True)
class R3v1Header:
    """The fields of an R3/v1 header, as read (see the module docstring)."""

    version: int
    selector: str
    id_bytes: int
    flags: int
    total_tokens: int
    replayed_tokens: int
    replay_start: int
    selector_bytes: int
    matrix_bytes: int


def _zstd() -> Any:
    try:
        return importlib.import_module("zstandard")
    except ImportError as e:
        raise EngineOutputError(
            "R3/v1 payloads are zstd-compressed and the `zstandard` package is not installed: "
            f"pip install 'rr-vllm[{R3V1_EXTRA}]'"
        ) from e


def _unbase64(data: str | bytes) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:  # ValueError: non-ASCII str
        raise EngineOutputError(
            f"R3/v1 payload is not valid base64 ({e}); pass the string of "
            "payloads.router_replay.data as it came, not re-encoded or cut"
        ) from e


def _unzstd(compressed: bytes, limit: int) -> bytes:
    """The frames of ``compressed``, one after another, refused once they would hold more than
    ``limit`` bytes (the most a sample's envelope can hold). Each frame is first read to at most
    that bound, whatever size its header declares, so a bomb never allocates more; then
    decompressed whole, which finds the frame's end (and a frame cut short)."""
    zstd = _zstd()
    out: list[bytes] = []
    rest, left = compressed, limit
    try:
        while rest:
            with zstd.ZstdDecompressor().stream_reader(rest) as reader:
                size = len(reader.read(left + 1))
            if size > left:
                raise EngineOutputError(
                    f"R3/v1 payload decompresses to more than {limit} bytes, the most an "
                    "envelope of this sample can hold (header, bitmap and uint16 ids of every "
                    "token): not this sample's envelope, or a decompression bomb"
                )
            d = zstd.ZstdDecompressor().decompressobj()
            out.append(d.decompress(rest))
            if not d.eof:
                raise EngineOutputError(
                    f"R3/v1 payload: the zstd frame ends early ({len(compressed)} compressed "
                    "bytes): the payload was cut in transfer"
                )
            left -= len(out[-1])
            rest = d.unused_data
    except zstd.ZstdError as e:
        raise EngineOutputError(f"R3/v1 payload: zstd frame is corrupt ({e})") from e
    if not out:
        raise EngineOutputError("R3/v1 payload is empty: no zstd frame")
    return b"".join(out)


def read_r3v1_header(raw: bytes) -> R3v1Header:
    """The checked header of decompressed R3/v1 bytes; the body length must match it exactly."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise EngineOutputError(
            f"read_r3v1_header takes the decompressed envelope's bytes; got {type(raw).__name__}"
        )
    if len(raw) < HEADER.size:
        raise EngineOutputError(
            f"R3/v1 payload has {len(raw)} bytes after decompression, fewer than the "
            f"{HEADER.size}-byte header: not an R3/v1 envelope, or cut"
        )
    magic, version, mode, width, flags, t, r, start, sel, mat = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise EngineOutputError(
            f"R3/v1 payload starts with {magic!r}, not the magic {MAGIC!r}: another format"
        )
    if version not in R3V1_VERSIONS:
        raise EngineOutputError(
            f"R3/v1 header version {version}; rr decodes versions {list(R3V1_VERSIONS)}: "
            "upgrade rr-vllm, or ask the service for r3/v1"
        )
    if mode not in SELECTORS:
        raise EngineOutputError(
            f"R3/v1 selector mode {mode}; expected 0 (ALL), 1 (SUFFIX) or 2 (BITMAP)"
        )
    if width not in WIDTHS:
        raise EngineOutputError(f"R3/v1 routing dtype {width}; expected 1 (uint8) or 2 (uint16)")
    if flags & ~LITTLE_ENDIAN or (width > 1 and not flags & LITTLE_ENDIAN):
        raise EngineOutputError(
            f"R3/v1 flags {flags:#04x}: only bit 0 (little-endian ids) is defined, and uint16 "
            "ids need it; rr will not guess another byte order or meaning"
        )
    if len(raw) != HEADER.size + sel + mat:
        raise EngineOutputError(
            f"R3/v1 payload has {len(raw) - HEADER.size} body bytes; the header promises "
            f"{sel} selector + {mat} matrix bytes = {sel + mat}: "
            + (
                "truncated (see `rr explain G10`)"
                if len(raw) < HEADER.size + sel + mat
                else "trailing bytes"
            )
        )
    return R3v1Header(version, SELECTORS[mode], width, flags, t, r, start, sel, mat)


def _positions(h: R3v1Header, selector: bytes) -> np.ndarray:
    """Token positions of the R matrices, checked against the header."""
    t, r = h.total_tokens, h.replayed_tokens
    if h.selector != "bitmap" and h.selector_bytes:
        raise EngineOutputError(
            f"R3/v1 {h.selector.upper()} selector carries {h.selector_bytes} selector bytes; "
            "only BITMAP has any"
        )
    if h.selector == "all":
        if r != t or h.replay_start:
            raise EngineOutputError(
                f"R3/v1 ALL selector with {r} replayed of {t} tokens starting at "
                f"{h.replay_start}; ALL replays every token from 0"
            )
        return np.arange(t)
    if h.selector == "suffix":
        if h.replay_start + r != t:  # a suffix ends at the last token: start is redundant
            raise EngineOutputError(
                f"R3/v1 SUFFIX selector replays tokens {h.replay_start}..{h.replay_start + r - 1} "
                f"of a {t}-token sample; a suffix ends at token {t - 1}"
            )
        return np.arange(h.replay_start, h.replay_start + r)
    if len(selector) != (t + 7) // 8:
        raise EngineOutputError(
            f"R3/v1 BITMAP has {len(selector)} bytes; {t} tokens need {(t + 7) // 8}"
        )
    bits = np.unpackbits(np.frombuffer(selector, np.uint8), bitorder="little")
    if bits[t:].any():
        raise EngineOutputError(f"R3/v1 BITMAP marks tokens past the sample's {t} tokens")
    positions = np.flatnonzero(bits[:t])
    if positions.size != r:
        raise EngineOutputError(
            f"R3/v1 BITMAP marks {positions.size} tokens; the header says {r} were replayed"
        )
    return positions


def _matrices(h: R3v1Header, body: bytes, meta: RouteMeta) -> np.ndarray:
    """The ``[R, M, K]`` ids, checked against the meta's M, K and E."""
    m, k, e = len(meta.moe_slots), meta.top_k, meta.num_experts
    per_token = m * k * h.id_bytes
    if h.matrix_bytes != h.replayed_tokens * per_token:
        raise EngineOutputError(
            f"R3/v1 matrix has {h.matrix_bytes} bytes for {h.replayed_tokens} tokens; the meta "
            f"needs {per_token} per token ({m} MoE layers x top_k {k} x {h.id_bytes}-byte ids): "
            "wrong model config (MoE layer count, top_k), or an envelope of another model"
        )
    if h.id_bytes == 1 and e > 256:
        raise EngineOutputError(
            f"R3/v1 ids are uint8 but num_experts={e} needs ids up to {e - 1}: they were wrapped "
            "when stored (E4); the service must send uint16 ids; see `rr explain E4`"
        )
    ids = np.frombuffer(body, WIDTHS[h.id_bytes]).reshape(h.replayed_tokens, m, k)
    if ids.size and int(ids.max()) >= e:
        row, layer, _ = (int(v) for v in np.argwhere(ids >= e)[0])
        raise EngineOutputError(
            f"R3/v1 id {int(ids[row, layer].max())} at replayed token {row}, MoE layer "
            f"{meta.routed_layer_numbers[layer]} is outside [0, {e}): wrong num_experts, or "
            "physical ids"
        )
    return ids


def _data(payload: Any) -> str | bytes:
    """The base64 text of a payload, or of a ``router_replay`` mapping checked by its manifest."""
    if isinstance(payload, Mapping):
        manifest = payload.get("manifest") or {}
        version, codec = manifest.get("PayloadVersion"), manifest.get("Compression")
        if version not in (None, "r3/v1") or codec not in (None, "zstd"):
            raise EngineOutputError(
                f"router_replay manifest says PayloadVersion={version!r}, "
                f"Compression={codec!r}; rr decodes 'r3/v1' with 'zstd'"
            )
        if "data" not in payload:
            raise EngineOutputError("router_replay payload has no 'data' (the base64 blob)")
        payload = payload["data"]
    if not isinstance(payload, str | bytes):
        raise EngineOutputError(
            f"R3/v1 payload must be base64 text (str or bytes); got {type(payload).__name__}"
        )
    return payload


#: The options :func:`decode_r3v1` reads (the envelope's selector places the rows).
READS = frozenset({"on_abort"})


def decode_r3v1(
    payload: str | bytes | Mapping[str, Any],
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int,
    num_generated_tokens: int,
    finish_reason: str | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """One sample's routes from an R3/v1 envelope (base64 text, or the trace's
    ``payloads.router_replay`` mapping), on the ``all_layers`` axis of the meta. The envelope's
    ``total_token_count`` must be the sample's P + G tokens (the header alone cannot show that
    it is this sample's). Option: ``on_abort``. Every fault raises :class:`EngineOutputError`.
    One sample (``.only()``); the deprecated form (a RouteMeta, option keywords) returns the
    sample itself."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_r3v1")
    meta = opts.meta
    sample = sample_of(
        "R3/v1", num_prompt_tokens, num_generated_tokens, finish_reason=finish_reason
    )
    p, t, finish_reason = sample.num_prompt_tokens, sample.num_tokens, sample.finish_reason
    most = HEADER.size + -(-t // 8) + t * len(meta.moe_slots) * meta.top_k * max(WIDTHS)
    raw = _unzstd(_unbase64(_data(payload)), most)
    h = read_r3v1_header(raw)
    if t != h.total_tokens:
        raise EngineOutputError(
            f"R3/v1 envelope covers {h.total_tokens} tokens; the sample has {t} ({p} prompt + "
            f"{t - p} generated): routes of another sample, or tokens trimmed differently "
            "(see `rr explain D1`)"
        )
    if sample.aborted:
        return decoded_one(unrouted(sample, opts), opts, legacy)
    if h.total_tokens and not h.replayed_tokens:  # D3: never an empty route set
        raise EngineOutputError(
            f"R3/v1 envelope replays 0 of {h.total_tokens} tokens for a request that finished "
            f"with finish_reason={finish_reason!r} (D3): capture was off for it; see "
            "`rr explain D3`"
        )
    start = HEADER.size + h.selector_bytes
    positions_R = _positions(h, raw[HEADER.size : start])
    ids_RMK = _matrices(h, raw[start:], meta)
    routes_TLK = np.zeros((h.total_tokens, opts.layer_slots, opts.top_k), opts.id_dtype)
    routes_TLK[positions_R[:, None], np.asarray(meta.moe_slots)[None, :]] = ids_RMK
    valid_T = np.zeros(h.total_tokens, dtype=bool)
    valid_T[positions_R] = True
    one = SampleRoutes(
        routes_TLK=routes_TLK,
        valid_T=valid_T,
        num_prompt_tokens=p,
        prompt_start=int(positions_R[0]) if positions_R.size else 0,
        finish_reason=finish_reason,
    )
    return decoded_one(one, opts, legacy)
