"""Compiled decoders (numba, optional, chosen by :mod:`rr_core.kernels`) of the ``set`` payload
of top-8 byte ids and the ``packed`` payload of ids below 2**7, bit for bit what the numpy
decoders return.

Shape legend: R (token, MoE layer) pairs, V valid rows, M MoE slots, L layer slots, X rows of
the caller's output, G groups of 8 packed ids.

Both read the stream as aligned 64-bit words (:func:`rr_core.codecs.stream_words.stream_words`)
and split their rows across threads (:func:`rr_core.threads.over_ranges`, the GIL released).

- ``set``: blocks of ranks, each unranked greedily from ``c_8`` down to ``c_3`` (per
  position an integer bucket of the rank from its leading-zero count, one compare with the
  bucket's threshold, one table entry; the tables of all six positions take ~36 KiB for
  E = 128, so they stay in the caches), the last two ids from one table; one position of the
  whole block at a time so that the block's rows are independent work for the CPU. The ids go
  straight into the caller's ``[X, L, K]`` output of any integer dtype: pair ``v * M + m``
  lands on row ``rows[v]`` (row ``v`` when ``rows`` is empty), slot ``slots[m]``. A block whose
  pairs fill one run of whole rows in order is written in place; any other block goes through
  a block-sized spill buffer, then to each pair's row and slot. Indices are unsigned: numba
  then skips its negative-index wrap-around.
  A rank ``>= C(E, 8)`` fails the call.
- ``packed`` (width ``w < 8``): 8 groups fill ``w`` aligned words; each group's ``w`` bytes
  become its 8 ids as one word by :mod:`rr_core.codecs.bitpack_bytes`' masks and multiplies.
  One kernel per width, its shifts and masks compile-time constants (twice as fast as reading
  them from arrays).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from functools import lru_cache
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from rr_core.codecs.sets_fast import TOP_K
from rr_core.codecs.stream_words import stream_words
from rr_core.kernels import EMPTY_INT64, compile_kernel
from rr_core.threads import over_ranges

_UNRANK: list[Callable[..., bool]] = []
_BYTES: dict[int, Callable[..., None]] = {}
_UNIT = 1024  # rows per unit of a thread's range
_BLOCK = 256  # ranks unranked together (their state stays in L1)
_leading_zeros: Any = None  # numba's count of leading zero bits, set when a kernel is built
_NEVER = 1 << 54  # a threshold no rank reaches (C(256, 8) < 2**49); shifted by 8 it fits int64


def _bucket_of(rank: int, bits: int) -> int:
    """A monotone bucket of a rank (0 shares 1's): its leading one's place, then the ``bits``
    bits after that one (the kernel computes it with a leading-zero count, which vectorises)."""
    x = max(rank, 1)
    top = x.bit_length() - 1
    return top << bits | ((x << (63 - top)) >> (63 - bits)) & ((1 << bits) - 1)


def _build_unrank() -> Callable[..., bool]:
    U = np.uint64
    B = _BLOCK
    global _leading_zeros  # a global of the kernel, not a closure cell: numba caches it then
    _leading_zeros = importlib.import_module("numba.cpython.unsafe.numbers").leading_zeros

    def unrank_range(  # type: ignore[no-untyped-def]
        words, tail, width, start, stop, total, bits_S, bases_S, table, comb_SC, last, rows,
        slots, L, runs, out
    ):  # fmt: skip
        nw = words.size
        width_mask = U((1 << width) - 1)
        # pairs whose field and the word after it lie in ``words``: read without a bound test
        inside = max(start, min(stop, (64 * (nw - 1)) // width))
        r = np.empty(B, dtype=np.int64)
        at = np.empty(B, dtype=np.uint64)  # each rank's bucket entry in this step's table
        spill = np.empty_like(out[: B * TOP_K])  # a block's ids bound for scattered places
        M = slots.size
        identity = rows.size == 0
        ok = True
        for a in range(start, stop, B):
            n = min(B, stop - a)
            bit = U(a) * U(width)
            for i in range(min(n, max(0, inside - a))):
                w, s = bit >> U(6), bit & U(63)
                r[i] = np.int64(
                    ((words[w] >> s) | ((words[w + U(1)] << U(1)) << (U(63) - s))) & width_mask
                )
                bit += U(width)
            for i in range(min(n, max(0, inside - a)), n):
                w, s = bit >> U(6), bit & U(63)
                lo = words[w] if w < U(nw) else tail[w - U(nw)]
                hi = words[w + U(1)] if w + U(1) < U(nw) else tail[w + U(1) - U(nw)]
                r[i] = np.int64(((lo >> s) | ((hi << U(1)) << (U(63) - s))) & width_mask)
                bit += U(width)
            bad = False
            for i in range(n):
                bad |= r[i] >= total
            if bad:  # no set: the call fails, the block still runs on valid indices
                ok = False
                for i in range(n):
                    if r[i] >= total:
                        r[i] = 0
            # the block's ids land in ``out`` itself, pair p at 8 p + shift, where its pairs
            # fill one run of whole rows in order (``runs``: every slot in order, rows
            # increasing); elsewhere in ``spill`` first, then at each pair's row and slot
            v, j = a // M, a % M
            last_v = (a + n - 1) // M
            straight = runs and (identity or rows[last_v] - rows[v] == last_v - v)
            target = out if straight else spill
            first = U(a) * U(TOP_K) if straight else U(0)
            if straight and not identity:
                first += U((rows[v] - v) * L * TOP_K)
            for step in range(bits_S.size):
                bits, base, col = bits_S[step], U(bases_S[step]), U(TOP_K - 1 - step)
                comb_C = comb_SC[step]
                for i in range(n):  # _bucket_of(r[i], bits); vectorises, the gathers do not
                    x = U(r[i]) | U(1)
                    lz = _leading_zeros(x)
                    after = ((x << lz) >> U(63 - bits)) & U((1 << bits) - 1)
                    at[i] = base + (((U(63) - lz) << U(bits)) | after)
                for i in range(n):
                    ri = r[i]
                    e = table[at[i]]  # threshold << 8 | the c below it
                    c = (e & U(0xFF)) + U(ri >= np.int64(e >> U(8)))
                    target[first + U(i) * U(TOP_K) + col] = c
                    r[i] = ri - comb_C[c]
            for i in range(n):
                e = last[r[i]]
                o = first + U(i) * U(TOP_K)
                target[o] = e & 0xFF
                target[o + U(1)] = e >> 8
            if not straight:
                for i in range(n):
                    row = v if identity else rows[v]
                    o = (U(row) * U(L) + U(slots[j])) * U(TOP_K)
                    for q in range(TOP_K):
                        out[o + U(q)] = spill[U(i) * U(TOP_K) + U(q)]
                    j += 1
                    if j == M:
                        j = 0
                        v += 1
        return ok

    return compile_kernel(unrank_range)  # type: ignore[no-any-return]


@lru_cache(maxsize=16)
def _set_tables(
    num_experts: int,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(C(E, 8), bits [S], bases [S], table, comb [S, E + 1], last)`` for positions k = 8 .. 3.
    Step s finds the largest ``c`` with ``C(c, k) <= rank`` in one compare: with ``bits`` fine
    enough that no two thresholds share a :func:`_bucket_of`, a rank's ``c`` is the one below its
    bucket or, at or above the threshold inside it, the next. Bucket b of step s is
    ``table[bases[s] + b]``, ``threshold << 8 | c below`` (the threshold :data:`_NEVER` in a
    bucket without one); ``comb[s, c]`` is ``C(c, k)``. ``last`` holds ``c_1 | c_2 << 8`` at
    index ``C(c_2, 2) + c_1``. About 36 KiB of tables for E = 128: they stay in the caches
    while a batch streams through."""
    E = num_experts
    bits_S, bases_S, parts, comb = [], [], [], []
    size = 0
    for k in range(TOP_K, 2, -1):
        thresholds = [math.comb(c, k) for c in range(k, E + 1)]  # C(E, k): no rank reaches it
        bits = next(
            b for b in range(24)
            if all(_bucket_of(x, b) < _bucket_of(y, b) for x, y in pairwise(thresholds))
        )  # fmt: skip
        buckets = np.array([_bucket_of(x, bits) for x in thresholds])
        count = np.searchsorted(buckets, np.arange(buckets[-1] + 1))  # thresholds below each
        nxt = np.minimum(count, buckets.size - 1)  # the first threshold at or above each
        inside = buckets[nxt] == np.arange(count.size)
        threshold = np.where(inside, np.array(thresholds, dtype=np.int64)[nxt], _NEVER)
        parts.append(threshold << 8 | (k - 1 + count))
        bits_S.append(bits)
        bases_S.append(size)
        size += count.size
        comb.append([math.comb(c, k) for c in range(E + 1)])
    c2 = np.array([b for b in range(E) for _ in range(b)], dtype=np.uint16)
    c1 = np.array([a for b in range(E) for a in range(b)], dtype=np.uint16)
    return (
        math.comb(E, TOP_K),
        np.array(bits_S, dtype=np.int64),
        np.array(bases_S, dtype=np.int64),
        np.concatenate(parts).astype(np.uint64),
        np.array(comb, dtype=np.int64),
        c1 | c2 << 8,
    )


def unrank_into(
    stream_P: torch.Tensor,
    pairs: int,
    num_experts: int,
    width: int,
    out_XLK: torch.Tensor,
    rows_V: torch.Tensor | None,
    slots_M: torch.Tensor,
) -> bool:
    """Decode ``pairs = V * M`` set ranks of ``width`` bits into ``out_XLK`` (CPU, contiguous,
    integer, K = 8) at rows ``rows_V`` (int64; None: row v) and slots ``slots_M`` (int64);
    False on a rank ``>= C(E, 8)`` (the payload is corrupt; ``out_XLK`` is then partly
    written)."""
    if pairs == 0:
        return True
    if not _UNRANK:
        _UNRANK.append(_build_unrank())
    words, tail = stream_words(stream_P)
    tables = _set_tables(num_experts)
    L = out_XLK.shape[1]
    out = out_XLK.numpy().reshape(-1)
    rows = EMPTY_INT64 if rows_V is None else rows_V.numpy()
    slots = slots_M.numpy()
    # every slot in order and rows increasing: runs of consecutive rows are one stretch of out
    runs = slots.size == L and bool((slots == np.arange(L)).all())
    runs = runs and bool(rows.size < 2 or (rows[1:] > rows[:-1]).all())
    kernel = _UNRANK[0]

    def run(a: int, b: int) -> bool:
        return bool(kernel(words, tail, width, a, b, *tables, rows, slots, L, runs, out))

    return all(over_ranges(pairs, _UNIT, run))


def _build_bytes(width: int) -> Callable[..., None]:
    """The kernel of one width: its shifts and masks are constants of the compiled code."""
    from rr_core.codecs.bitpack_bytes import _gather

    U = np.uint64
    w = U(width)
    at = tuple(U(8 * width * i // 64) for i in range(8))  # word of group i in its block
    shift = tuple(U(8 * width * i % 64) for i in range(8))
    group_mask = U((1 << (8 * width)) - 1)
    low = U(sum(((1 << width) - 1) << (8 * i) for i in range(width)))
    terms = tuple(tuple(U(v) for v in _gather(width, j)) for j in range(8 - width))

    def byte_blocks(words, start, stop, out):  # type: ignore[no-untyped-def]
        for blk in range(start, stop):
            first = U(blk) * w
            top = first + w - U(1)  # a group that ends in the block's last word needs no next
            for i in range(8):
                k, s = first + at[i], shift[i]
                hi = words[min(k + U(1), top)]
                x = ((words[k] >> s) | ((hi << U(1)) << (U(63) - s))) & group_mask
                y = x & low
                for t in range(len(terms)):
                    mask, mult, keep = terms[t]
                    y |= ((x & mask) * mult) & keep  # wraps; the kept bits never carry
                out[U(8) * U(blk) + U(i)] = y

    return compile_kernel(byte_blocks)  # type: ignore[no-any-return]


def unpack_byte_blocks(stream_P: torch.Tensor, groups: int, width: int, out_G: np.ndarray) -> int:
    """The first groups of a byte-group stream (``1 <= width <= 7``) into ``out_G`` (uint64, one
    word of 8 uint8 ids per group), in whole blocks of 8 groups; returns how many groups."""
    blocks = groups // 8
    if not blocks:
        return 0
    if width not in _BYTES:
        _BYTES[width] = _build_bytes(width)
    words, _ = stream_words(stream_P)
    kernel = _BYTES[width]
    over_ranges(blocks, _UNIT, lambda a, b: kernel(words, a, b, out_G))
    return 8 * blocks
