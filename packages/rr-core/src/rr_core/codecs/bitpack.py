"""Fixed-width bit fields packed into a byte stream, vectorised on any torch device.

Shape legend: R fields, W 32-bit limbs per field (least significant first), G groups of fields
that fill a whole number of 32-bit words, J fields per group, P bytes of stream.

A field is ``width`` bits wide; field r occupies stream bits ``[r * width, (r + 1) * width)``,
least significant bit first, bytes little-endian. Fields arrive and leave as 32-bit limbs held in
int64 so that every shift stays inside int64 without a sign bit on any device (torch has no
portable uint64 shifts). Loops run over the fields of one group and their limbs, never over rows.

Fields of at most 63 bits take a faster route (:func:`pack_fields`, :func:`pack_ids`) that yields
the same stream: B blocks of groups, g fields per group, m 64-bit words per group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

MASK32 = (1 << 32) - 1


def limbs_for(width: int) -> int:
    """How many 32-bit limbs hold a field of ``width`` bits."""
    return max(1, -(-width // 32))


def stream_bytes(count: int, width: int) -> int:
    """Bytes of a stream of ``count`` fields of ``width`` bits."""
    return -(-count * width // 8)


def _group(width: int) -> tuple[int, int]:
    """``(fields, words)`` of the smallest group of fields ending on a 32-bit word boundary."""
    fields = 32 // math.gcd(width, 32)
    return fields, fields * width // 32


def _chunks(width: int) -> list[tuple[int, int, int, int, int]]:
    """``(field, limb, word, shift, bits)`` of every limb of every field in one group."""
    fields, _ = _group(width)
    out = []
    for j in range(fields):
        for limb in range(limbs_for(width)):
            bits = min(32, width - 32 * limb)
            word, shift = divmod(j * width + 32 * limb, 32)
            out.append((j, limb, word, shift, bits))
    return out


def pack_bits(limbs_RW: torch.Tensor, width: int) -> torch.Tensor:
    """The stream (uint8 ``[P]``) of ``R`` fields given as int64 limbs ``[R, W]``.

    Every limb must already be below ``2**32`` (the top one below its share of ``width``); bits
    above the field width would corrupt the neighbouring field, so callers check their range.
    """
    R = limbs_RW.shape[0]
    dev = limbs_RW.device
    if width == 0 or R == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev)
    fields, words = _group(width)
    G = -(-R // fields)
    if G * fields != R:
        pad = limbs_RW.new_zeros((G * fields - R, limbs_RW.shape[1]))
        limbs_RW = torch.cat([limbs_RW, pad])
    # Field-major copy: each chunk below is then a contiguous row, not a strided column.
    limbs_JWG = limbs_RW.reshape(G, fields, -1).permute(1, 2, 0).contiguous()
    words_WG = torch.zeros((words, G), dtype=torch.int64, device=dev)
    tmp_G = torch.empty(G, dtype=torch.int64, device=dev)  # reused: no allocation per chunk
    for j, limb, word, shift, bits in _chunks(width):
        chunk_G = limbs_JWG[j, limb]
        if shift == 0:
            words_WG[word] |= chunk_G
            continue
        torch.bitwise_left_shift(chunk_G, shift, out=tmp_G)
        tmp_G &= MASK32
        words_WG[word] |= tmp_G
        if shift + bits > 32:
            torch.bitwise_right_shift(chunk_G, 32 - shift, out=tmp_G)
            words_WG[word + 1] |= tmp_G
    words_GW = words_WG.t()
    # int64 holding uint32 -> int32 with the same bits, explicitly (no reliance on wrap-around).
    signed_GW = (words_GW - ((words_GW >> 31) << 32)).to(torch.int32)
    return signed_GW.reshape(-1).view(torch.uint8)[: stream_bytes(R, width)]


def unpack_bits(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: int64 limbs ``[count, W]`` on the stream's device."""
    dev = stream_P.device
    nl = limbs_for(width)
    if width == 0 or count == 0:
        return torch.zeros((count, nl), dtype=torch.int64, device=dev)
    need = stream_bytes(count, width)
    if stream_P.numel() != need:
        raise ValueError(
            f"a stream of {count} {width}-bit fields has {need} bytes, not {stream_P.numel()}"
        )
    fields, words = _group(width)
    G = -(-count // fields)
    full = torch.zeros(G * words * 4, dtype=torch.uint8, device=dev)
    full[:need] = stream_P
    words_WG = full.view(torch.int32).reshape(G, words).t().contiguous().to(torch.int64) & MASK32
    out_JWG = torch.empty((fields, nl, G), dtype=torch.int64, device=dev)
    tmp_G = torch.empty(G, dtype=torch.int64, device=dev)  # reused: no allocation per chunk
    for j, limb, word, shift, bits in _chunks(width):
        chunk_G = out_JWG[j, limb]
        torch.bitwise_right_shift(words_WG[word], shift, out=chunk_G)
        if shift + bits > 32:
            torch.bitwise_left_shift(words_WG[word + 1], 32 - shift, out=tmp_G)
            chunk_G |= tmp_G
        chunk_G &= (1 << bits) - 1
    return out_JWG.permute(2, 0, 1).reshape(G * fields, nl)[:count]


# A group of g fields of F <= 63 bits fills m whole 64-bit words (g = 64 / gcd(F, 64)); every word
# is the OR of a few shifted fields, so a whole block of groups takes a few tensor operations per
# term. Blocks of about BLOCK words keep the temporaries in cache; only the stream goes to memory.
BLOCK = 1 << 15


@dataclass(frozen=True)
class _Term:
    """One shifted source column per target column: a slice, or a gather index for a block."""

    start: int
    index_X: torch.Tensor | None
    shift_1C: torch.Tensor
    keep_1C: torch.Tensor | None

    def take(self, src_BS: torch.Tensor) -> torch.Tensor:
        cols = self.shift_1C.shape[1]
        if self.index_X is None:
            return src_BS[:, self.start : self.start + cols]
        rows = src_BS.shape[0]
        return src_BS.reshape(-1).index_select(0, self.index_X[: rows * cols]).view(rows, cols)


def _term(
    cols: list[int],
    shifts: list[int],
    keep: list[int] | None,
    stride: int,
    block: int,
    dev: torch.device,
) -> _Term:
    def row(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int64, device=dev)[None, :]

    start = cols[0]
    if cols == list(range(start, start + len(cols))):  # a slice beats a gather
        return _Term(start, None, row(shifts), None if keep is None else row(keep))
    base_B1 = torch.arange(block, dtype=torch.int32, device=dev)[:, None] * stride
    index_X = (base_B1 + torch.tensor(cols, dtype=torch.int32, device=dev)).reshape(-1)
    return _Term(start, index_X, row(shifts), None if keep is None else row(keep))


@dataclass(frozen=True)
class _Plan:
    fields: int
    words: int
    block: int  # groups per block
    pack: tuple[_Term, ...]  # word = OR of terms; the first is a right shift, the rest left
    lo: _Term  # field = (first word >> s) & low bits ...
    hi: _Term | None  # ... | (next word << (64 - s)) & high bits, where the field straddles


@lru_cache(maxsize=64)
def _plan(width: int, dev: torch.device) -> _Plan:
    g = 64 // math.gcd(width, 64)
    m, block = width * g // 64, max(1, BLOCK // g)
    pack = []
    for k in range(-(-64 // width) + 1):
        cols, shifts, keep = [], [], []
        for w in range(m):
            j = 64 * w // width + k
            d = width * j - 64 * w
            ok = j < g and d < 64
            cols.append(min(j, g - 1))
            shifts.append(abs(d) if ok else 0)
            keep.append(-1 if ok else 0)
        if any(keep):
            pack.append(_term(cols, shifts, None if all(keep) else keep, g, block, dev))
    first = [width * j // 64 for j in range(g)]
    bit = [width * j % 64 for j in range(g)]
    straddle = [s + width > 64 for s in bit]
    low = [(1 << min(width, 64 - s)) - 1 for s in bit]
    lo = _term(first, bit, low, m, block, dev)
    hi = None
    if any(straddle):
        nxt = [min(a + 1, m - 1) for a in first]
        shifts = [64 - s if t else 0 for s, t in zip(bit, straddle, strict=True)]
        high = [((1 << width) - 1) & ~lw if t else 0 for lw, t in zip(low, straddle, strict=True)]
        hi = _term(nxt, shifts, high, m, block, dev)
    return _Plan(g, m, block, tuple(pack), lo, hi)


def _pack_block(fields_BG: torch.Tensor, words_BM: torch.Tensor, plan: _Plan) -> None:
    first, *rest = plan.pack
    torch.bitwise_right_shift(first.take(fields_BG), first.shift_1C, out=words_BM)
    for term in rest:
        part_BM = torch.bitwise_left_shift(term.take(fields_BG), term.shift_1C)
        if term.keep_1C is not None:
            part_BM &= term.keep_1C
        words_BM |= part_BM


def _unpack_block(words_BM: torch.Tensor, fields_BG: torch.Tensor, plan: _Plan) -> None:
    for k, term in enumerate((plan.lo, plan.hi)):
        if term is None:
            continue
        if k == 0:
            part_BG = torch.bitwise_right_shift(term.take(words_BM), term.shift_1C, out=fields_BG)
        else:
            part_BG = torch.bitwise_left_shift(term.take(words_BM), term.shift_1C)
        if term.keep_1C is not None:
            part_BG &= term.keep_1C
        if k:
            fields_BG |= part_BG


def _lane_masks(lane: int, width: int) -> list[tuple[int, int, int]]:
    """``(shift, low-half mask, high-half mask)`` of each merge of lane pairs, ``lane`` bits up."""
    out, c, L = [], width, lane
    while L < 64:
        low = sum(((1 << c) - 1) << (2 * L * i) for i in range(32 // L))
        out.append((L - c, low, low << c))
        c, L = 2 * c, 2 * L
    return out


def pack_fields(fields_Q: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`pack_bits` of int64 fields ``[Q]`` below ``2**width``, ``width <= 63``."""
    return _pack(fields_Q, fields_Q.numel(), width, width, 1)


def pack_ids(ids_n: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`pack_bits` of uint8 or int16 ids ``[n]`` below ``2**width`` (narrower than a lane).

    A word holds 8 / itemsize ids; merging lane pairs (``lo + hi << L`` becomes ``lo + hi << c``)
    squeezes them into its low bits, and the words are then packed as fields of
    ``width * ids per word`` bits.
    """
    per = 8 // ids_n.element_size()
    return _pack(ids_n, ids_n.numel(), width, width * per, per)


def _pack(src: torch.Tensor, count: int, width: int, field: int, per: int) -> torch.Tensor:
    dev = src.device
    if count == 0 or width == 0:  # a 0-bit field (a single expert) takes no bytes
        return torch.zeros(0, dtype=torch.uint8, device=dev)
    plan = _plan(field, dev)
    g, m, step = plan.fields, plan.words, plan.block * plan.fields * per
    full, G = count // (g * per), -(-count // (g * per))
    words_GM = torch.empty((G, m), dtype=torch.int64, device=dev)
    masks = _lane_masks(8 * src.element_size(), width) if per > 1 else []
    tmp = torch.empty(plan.block * g, dtype=torch.int64, device=dev)
    acc = torch.empty_like(tmp)
    end = full * g * per
    tail = src.new_zeros(g * per)
    tail[: count - end] = src[end:]
    starts = [*range(0, end, step), *([end] if full < G else [])]
    for a in starts:
        part = src[a : min(a + step, end)] if a < end else tail
        x = part.view(torch.int64) if per > 1 else part
        n = x.numel()
        for shift, low, high in masks:  # lo + hi << L  ->  lo + hi << c (bitwise ops only:
            t = torch.bitwise_right_shift(x, shift, out=tmp[:n])  # int64 add/sub are slower)
            t &= high
            x = torch.bitwise_and(x, low, out=acc[:n])
            x |= t
        r = a // (g * per)
        _pack_block(x.view(-1, g), words_GM[r : r + n // g], plan)
    return words_GM.view(-1).view(torch.uint8)[: stream_bytes(count, width)]


def _words(stream_P: torch.Tensor, groups: int, m: int) -> torch.Tensor:
    """The stream as int64 words ``[groups, m]``, zero-padded; a view when it can be."""
    size = groups * m * 8
    if stream_P.numel() == size and stream_P.storage_offset() % 8 == 0:
        return stream_P.view(torch.int64).view(groups, m)
    padded = torch.zeros(size, dtype=torch.uint8, device=stream_P.device)
    padded[: stream_P.numel()] = stream_P
    return padded.view(torch.int64).view(groups, m)


def unpack_fields(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_fields`: int64 fields ``[count]``."""
    return _unpack(stream_P, count, width, width, torch.int64)


def unpack_ids(stream_P: torch.Tensor, count: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`pack_ids`: ids ``[count]`` of ``dtype`` (uint8 or int16)."""
    per = 8 // dtype.itemsize
    return _unpack(stream_P, count, width, width * per, dtype)


def _unpack(
    stream_P: torch.Tensor, count: int, width: int, field: int, dtype: torch.dtype
) -> torch.Tensor:
    dev = stream_P.device
    need = stream_bytes(count, width)
    if stream_P.numel() != need:
        raise ValueError(
            f"a stream of {count} {width}-bit fields has {need} bytes, not {stream_P.numel()}"
        )
    if width == 0:  # every 0-bit field is 0
        return torch.zeros(count, dtype=dtype, device=dev)
    per = 8 // dtype.itemsize
    plan = _plan(field, dev)
    g, m, step = plan.fields, plan.words, plan.block
    G = -(-count // (g * per))
    words_GM = _words(stream_P, G, m)
    out = torch.empty(G * g * per, dtype=dtype, device=dev)
    fields_GG = out.view(torch.int64).view(G, g)
    masks = _lane_masks(8 * dtype.itemsize, width)[::-1] if per > 1 else []
    tmp = torch.empty(step * g, dtype=torch.int64, device=dev)
    for a in range(0, G, step):
        y_BG = fields_GG[a : a + step]
        _unpack_block(words_GM[a : a + step], y_BG, plan)
        y = y_BG.view(-1)
        for shift, _, high in masks:  # lo + hi << c  ->  lo + hi << L
            t = torch.bitwise_and(y, high, out=tmp[: y.numel()])
            y ^= t
            t <<= shift
            y |= t
    return out[:count]
