"""Compiled decoders (numba, optional, chosen by :mod:`rr_core.kernels`) of the ``set`` payload
of top-8 byte ids and the ``packed`` payload of ids below 2**7, bit for bit what the numpy
decoders return.

Shape legend: R (token, MoE layer) pairs, V valid rows, M MoE slots, L layer slots, X rows of
the caller's output, G groups of 8 packed ids.

Both read the stream as aligned 64-bit words (:func:`rr_core.codecs.stream_words.stream_words`)
and split their rows across threads (:func:`rr_core.threads.over_ranges`, the GIL released).

- ``set``: blocks of ranks, each unranked greedily from ``c_8`` down with the bucket tables of
  :mod:`rr_core.codecs.sets` (per position a float32 bucket, one compare, one gather; the last
  two ids from one table), one position of the whole block at a time so that the
  block's rows are independent work for the CPU. The ids go straight into the caller's
  ``[X, L, K]`` output of any integer dtype: pair ``v * M + m`` lands on row ``rows[v]`` (row
  ``v`` when ``rows`` is empty), slot ``slots[m]``. Indices are unsigned: numba then skips
  its negative-index wrap-around, a third of the work. A rank ``>= C(E, 8)`` fails the call.
- ``packed`` (width ``w < 8``): 8 groups fill ``w`` aligned words; each group's ``w`` bytes
  become its 8 ids as one word by :mod:`rr_core.codecs.bitpack_bytes`' masks and multiplies.
  One kernel per width, its shifts and masks compile-time constants (twice as fast as reading
  them from arrays).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

from rr_core.codecs.sets import _greedy_cpu
from rr_core.codecs.sets_fast import TOP_K
from rr_core.codecs.stream_words import stream_words
from rr_core.kernels import EMPTY_INT64, compile_kernel
from rr_core.threads import over_ranges

_UNRANK: list[Callable[..., bool]] = []
_BYTES: dict[int, Callable[..., None]] = {}
_UNIT = 1024  # rows per unit of a thread's range
_BLOCK = 256  # ranks unranked together (their state stays in L1)


def _build_unrank() -> Callable[..., bool]:
    U = np.uint64
    B = _BLOCK

    def unrank_range(  # type: ignore[no-untyped-def]
        words, tail, width, start, stop, total, shifts, bases, table, last, rows, slots, L, out
    ):
        nw = U(words.size)
        width_mask = U((1 << width) - 1)
        r = np.empty(B, dtype=np.int64)
        bucket = np.empty(B, dtype=np.float32)
        bucket_bits = bucket.view(np.uint32)
        dst = np.empty(B, dtype=np.uint64)  # the first element of each pair's ids in ``out``
        at = np.empty(B, dtype=np.uint64)  # each rank's bucket in this step's table
        M, S = slots.size, shifts.size
        identity = rows.size == 0
        v = start // M
        j = start - v * M
        ok = True
        for a in range(start, stop, B):
            n = min(B, stop - a)
            for i in range(n):
                bit = U(a + i) * U(width)
                w, s = bit >> U(6), bit & U(63)
                if w + U(1) < nw:
                    lo, hi = words[w], words[w + U(1)]
                else:
                    lo = words[w] if w < nw else tail[w - nw]
                    hi = tail[w + U(1) - nw]
                r[i] = np.int64(((lo >> s) | ((hi << U(1)) << (U(63) - s))) & width_mask)
                row = v if identity else rows[v]
                dst[i] = (U(row) * U(L) + U(slots[j])) * U(TOP_K)
                j += 1
                if j == M:
                    j = 0
                    v += 1
            bad = False
            for i in range(n):
                bad |= r[i] >= total
            if bad:  # no set: the call fails, the block still runs on valid indices
                ok = False
                for i in range(n):
                    if r[i] >= total:
                        r[i] = 0
            for step in range(S):
                shift, base, col = U(shifts[step]), U(bases[step]), U(TOP_K - 1 - step)
                for i in range(n):  # these two loops vectorise, the gathers below do not
                    bucket[i] = r[i]
                for i in range(n):
                    at[i] = base + U(3) * (U(bucket_bits[i]) >> shift)  # (thr, below, at/above)
                for i in range(n):
                    ri = r[i]
                    e = table[at[i] + U(1) + U(ri >= table[at[i]])]
                    out[dst[i] + col] = e & 0xFF
                    r[i] = ri - (e >> 8)
            for i in range(n):
                e = last[U(r[i])]
                out[dst[i]] = e & 0xFF
                out[dst[i] + U(1)] = (e >> 8) & 0xFF
        return ok

    return compile_kernel(unrank_range)  # type: ignore[no-any-return]


@lru_cache(maxsize=16)
def _set_tables(num_experts: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(C(E, 8), shifts [S], bases [S], table, last)``: the greedy steps of positions 8 .. 3
    (:func:`rr_core.codecs.sets_fast._greedy_cpu`) in one flat int64 table, bucket b of step s
    at ``bases[s] + 3 b`` as ``(threshold, entry below it, entry at or above it)``, each entry
    ``C(c, k) << 8 | c``; ``last`` holds ``c_1 | c_2 << 8`` at index ``C(c_2, 2) + c_1``. The
    last two ids come from a 32 KiB table rather than the last three from sets_fast's 1.4 MiB
    one: with a batch streaming through the caches, the extra step costs less than the misses."""
    E = num_experts
    steps = []
    for k in range(TOP_K, 2, -1):
        bits, thr_T, sub_J, val_J = _greedy_cpu(E, k)
        entry_J = (sub_J << 8) | val_J  # [2 * buckets]: 2 * bucket + (rank >= thr)
        steps.append((23 - bits, thr_T.numpy(), entry_J.numpy()))
    size = max(thr.size for _, thr, _ in steps)
    table = np.zeros((len(steps), size, 3), dtype=np.int64)
    for s, (_, thr, entry) in enumerate(steps):
        table[s, : thr.size, 0] = thr
        table[s, : thr.size, 1] = entry[0::2]
        table[s, : thr.size, 2] = entry[1::2]
    shifts = np.array([s for s, _, _ in steps], dtype=np.int64)
    bases = np.arange(len(steps), dtype=np.int64) * size * 3
    c2 = np.array([b for b in range(E) for _ in range(b)], dtype=np.int32)
    c1 = np.array([a for b in range(E) for a in range(b)], dtype=np.int32)
    return math.comb(E, TOP_K), shifts, bases, table.reshape(-1), c1 | c2 << 8


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
    total, shifts, bases, table, last = _set_tables(num_experts)
    L = out_XLK.shape[1]
    out = out_XLK.numpy().reshape(-1)
    rows = EMPTY_INT64 if rows_V is None else rows_V.numpy()
    slots = slots_M.numpy()
    kernel = _UNRANK[0]

    def run(a: int, b: int) -> bool:
        args = (total, shifts, bases, table, last, rows, slots, L, out)
        return bool(kernel(words, tail, width, a, b, *args))

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
