"""A CPU fast path of the set codec for top-8 uint8 ids (``E <= 256``), bit-identical to
:mod:`rr_core.codecs.sets`.

Shape legend: R (token, MoE layer) pairs, B rows of one block, K = 8 top-k, E experts.

Rows are handled in blocks of ``BLOCK`` so that every temporary stays in cache; the work inside a
block is a few dozen numpy operations over whole columns, never a loop over rows.

- Ranking: the block's K id columns are copied out and sorted by Batcher's odd-even merge network
  (19 elementwise min/max pairs on uint8). Sorted positions ``(2p, 2p + 1)`` then index a table of
  ``C(a, 2p + 1) + C(b, 2p + 2)``, four gathers per row in all. Pairs with ``a >= b`` (a repeated
  id) hold ``DUP``, which no sum of true ranks reaches. A caller may take each block's ranks while
  they are in cache (``put``), and feed each block to the unranking the same way (``get``).
- Unranking: greedy from ``c_8`` down, each position one bucket of the float32 rank, one
  threshold compare and one gather of ``C(c, k) << 8 | c``; the last three ids (two for ``E`` above
  185) come from one table indexed by the remaining rank, below ``C(E, 3)``. Each id is the low
  byte of its table entry, cast straight into its column of the uint8 ``[R, 8]`` output (a cast
  checked once at runtime).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

from rr_core.codecs.sets import _greedy_cpu
from rr_core.threads import over_ranges

Put = Callable[[int, np.ndarray, int], object]  # (first row, int64 ranks as uint64, next rank)
Get = Callable[[int, np.ndarray], object]  # (first row, an int64 block to fill, as uint64)
BLOCK = 1 << 16
TOP_K = 8
LAST_TABLE = 1 << 20  # entries of the table of the last three ids (int32)
DUP = 1 << 56  # above every rank of E <= 256 ids, and 4 of them stay below 2**63
_NETWORK = (
    (0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7), (1, 2), (5, 6),
    (0, 4), (1, 5), (2, 6), (3, 7), (2, 4), (3, 5), (1, 2), (3, 4), (5, 6),
)  # fmt: skip


def fast_shape(num_experts: int, top_k: int, ids_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`rank_fast` and :func:`unrank_fast` cover this shape."""
    return (
        top_k == TOP_K
        and TOP_K <= num_experts <= 256
        and device.type == "cpu"
        and ids_dtype == torch.uint8
        and sys.byteorder == "little"  # a row's first uint16 is c_1 | c_2 << 8
        and _buckets_agree(num_experts)
        and _low_bytes_cast()
    )


@lru_cache(maxsize=1)
def _low_bytes_cast() -> bool:
    """Does numpy's unsafe int64 / int32 -> uint8 / uint16 cast keep the low bits (C's modular
    conversion), as :func:`unrank_fast` needs to write ids straight from its table entries?"""
    v = [(c << 8 | a) + (s << 16) for s in (0, 1, 127, 1 << 40) for c in (0, 127, 255)
         for a in (0, 1, 128, 255)]  # fmt: skip
    for dtype, values in ((np.int64, v), (np.int32, [x for x in v if x < 1 << 31])):
        src = np.array(values, dtype=dtype)
        for to, mask in ((np.uint8, 0xFF), (np.uint16, 0xFFFF)):
            low = np.empty(src.size, dtype=to)
            np.copyto(low, src, casting="unsafe")
            if low.tolist() != [x & mask for x in values]:
                return False
    return True


@lru_cache(maxsize=16)
def _buckets_agree(num_experts: int) -> bool:
    """Does numpy's int64 -> float32 cast put every rank next to a threshold ``C(c, k)`` in the
    bucket that torch's cast (which built the tables) does? Checked once per expert count."""
    near = {math.comb(c, k) + d for k in range(3, TOP_K + 1) for c in range(num_experts + 1)
            for d in (-2, -1, 0, 1, 2)}  # fmt: skip
    v = np.array(sorted(x for x in near if 0 <= x < 1 << 62), dtype=np.int64)
    f = np.empty(v.size, dtype=np.float32)
    np.copyto(f, v, casting="unsafe")
    return bool(np.array_equal(f, torch.from_numpy(v).to(torch.float32).numpy()))


@lru_cache(maxsize=16)
def _pair_tables(num_experts: int) -> tuple[int, np.ndarray]:
    """``(shift, int64 [K / 2, E << shift])``: ``C(a, 2p + 1) + C(b, 2p + 2)`` at index
    ``a | b << shift`` of table p."""
    E = num_experts
    shift = (E - 1).bit_length()
    a = np.arange(1 << shift, dtype=np.int64)
    out = np.full((TOP_K // 2, E << shift), DUP, dtype=np.int64)
    for p in range(TOP_K // 2):
        lo = np.array([math.comb(int(v), 2 * p + 1) for v in a], dtype=np.int64)
        hi = np.array([math.comb(b, 2 * p + 2) for b in range(E)], dtype=np.int64)
        table_BA = out[p].reshape(E, 1 << shift)
        ok_BA = a[None, :] < np.arange(E)[:, None]
        table_BA[ok_BA] = (hi[:, None] + lo[None, :])[ok_BA]
    return shift, out


def rank_fast(
    ids_RK: torch.Tensor, num_experts: int, put: Put | None = None
) -> torch.Tensor | None:
    """Ranks int64 ``[R]`` of uint8 id rows ``[R, 8]``, or None if a row repeats an id. With
    ``put``, each block's ranks go to ``put(first row, ranks, rank of the next row or 0)``
    while in cache instead (the return value then only tells success). Ranges of blocks go to
    parallel threads, so ``put`` must take blocks in any order from any thread."""
    R = ids_RK.shape[0]
    src = ids_RK.contiguous().numpy()
    out = np.empty(R if put is None else 0, dtype=np.int64)
    done = over_ranges(R, BLOCK, lambda a, b: _rank_range(src, a, b, num_experts, out, put))
    return torch.from_numpy(out) if all(done) else None


def _rank_range(
    src_RK: np.ndarray, start: int, stop: int, num_experts: int, out: np.ndarray, put: Put | None
) -> bool:
    """Rows ``[start, stop)`` of :func:`rank_fast`; False on a repeated id. The last block also
    ranks row ``stop`` (when there is one), the ``following`` field of its ``put``."""
    shift, tables = _pair_tables(num_experts)
    B = min(BLOCK, max(1, stop - start)) + 1
    acc_B = np.empty(B, dtype=np.int64)
    cols = [np.empty(B, dtype=np.uint8) for _ in range(TOP_K + 1)]
    cols_KB = np.empty((TOP_K, B), dtype=np.uint8)
    idx = np.empty(B, dtype=np.int32)
    part = np.empty(B, dtype=np.int64)
    same = np.empty(B, dtype=bool)
    t_idx, t_part = torch.from_numpy(idx), torch.from_numpy(part)
    t_tables = [torch.from_numpy(t) for t in tables]
    for a in range(start, stop, B - 1):
        n = min(B - 1, stop - a)
        extra = int(put is not None and a + n == stop < src_RK.shape[0])  # the next range's row
        np.copyto(cols_KB[:, : n + extra], src_RK[a : a + n + extra].T)
        c = [cols_KB[i, : n + extra] for i in range(TOP_K)]
        spare = cols[TOP_K][: n + extra]
        for i, j in _NETWORK:  # c[i], c[j] <- min, max
            np.minimum(c[i], c[j], out=spare)
            np.maximum(c[i], c[j], out=c[j])
            c[i], spare = spare, c[i]
        for i in (1, 3, 5):  # pairs inside the table flag a repeat themselves
            if np.equal(c[i], c[i + 1], out=same[: n + extra]).any():
                return False
        acc = out[a : a + n] if put is None else acc_B[: n + extra]
        t_acc = torch.from_numpy(acc)
        for p in range(TOP_K // 2):
            np.left_shift(c[2 * p + 1], shift, out=idx[: n + extra], dtype=np.int32)
            np.bitwise_or(idx[: n + extra], c[2 * p], out=idx[: n + extra])
            dst = t_acc if p == 0 else t_part[: n + extra]
            torch.index_select(t_tables[p], 0, t_idx[: n + extra], out=dst)
            if p:
                np.add(acc, part[: n + extra], out=acc)
        if n and int(acc.max()) >= DUP:
            return False
        if put is not None:
            put(a, acc[:n].view(np.uint64), int(acc[n]) if extra else 0)
    return True


@lru_cache(maxsize=16)
def _unrank_tables(num_experts: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Per position ``k = 8 .. m + 1`` (``m`` from :func:`_last_ids`):
    ``(bits, thr [buckets], C(c, k) << 8 | c [buckets + 1])``, the second indexed by
    ``bucket + (rank >= thr)``: the answer one past a bucket's threshold is the answer below the
    next bucket, which starts above that threshold (at most one threshold per bucket)."""
    out = []
    for k in range(TOP_K, _last_ids(num_experts)[0], -1):
        bits, thr, sub, val = _greedy_cpu(num_experts, k)
        packed = (sub << 8) | val  # [2 * buckets]: 2 * bucket + (rank >= thr)
        out.append((23 - bits, thr, torch.cat([packed[0::2], packed[-1:]])))
    return out


@lru_cache(maxsize=16)
def _last_ids(num_experts: int) -> tuple[int, torch.Tensor]:
    """``(m, ids [C(E, m)])``: the last ``m`` ids of every rank below ``C(E, m)``, one table
    lookup for them all, as int32 ``c_1 | c_2 << 8 | ...``. ``m = 3`` while that table stays
    within ``LAST_TABLE`` entries, else 2."""
    E = num_experts
    c2 = np.array([b for b in range(E) for _ in range(b)], dtype=np.int32)
    c1 = np.array([a for b in range(E) for a in range(b)], dtype=np.int32)
    two = c1 | c2 << 8  # colex order: the index is the rank C(c_2, 2) + c_1
    if math.comb(E, 3) > LAST_TABLE:
        return 2, torch.from_numpy(two)
    three = [two[: math.comb(c, 2)] | np.int32(c << 16) for c in range(E)]
    return 3, torch.from_numpy(np.concatenate(three))


def unrank_fast(rank_R: torch.Tensor, num_experts: int) -> torch.Tensor | None:
    """Sorted uint8 ids ``[R, 8]`` of int64 ranks, or None if a rank is ``>= C(E, 8)``."""
    src = rank_R.numpy()
    return unrank_from(
        rank_R.shape[0], num_experts, lambda a, r: np.copyto(r, src[a : a + r.size].view(np.uint64))
    )


def unrank_from(R: int, num_experts: int, get: Get) -> torch.Tensor | None:
    """:func:`unrank_fast` of ``R`` ranks that ``get(first row, block)`` writes, a block at a
    time, into an int64 block (viewed as uint64). Ranges of blocks go to parallel threads."""
    out_RK = np.empty((R, TOP_K), dtype=np.uint8)
    done = over_ranges(R, BLOCK, lambda a, b: _unrank_range(a, b, num_experts, get, out_RK))
    return torch.from_numpy(out_RK) if all(done) else None


def _unrank_range(start: int, stop: int, num_experts: int, get: Get, out_RK: np.ndarray) -> bool:
    """Rows ``[start, stop)`` of :func:`unrank_from`; False if a rank is ``>= C(E, 8)``."""
    total = math.comb(num_experts, TOP_K)
    steps = _unrank_tables(num_experts)
    m, last = _last_ids(num_experts)
    B = min(BLOCK, stop - start)
    r = np.empty(B, dtype=np.int64)
    f = np.empty(B, dtype=np.float32)
    b = np.empty(B, dtype=np.int32)
    thr = np.empty(B, dtype=np.int64)
    v = np.empty(B, dtype=np.int64)
    low = np.empty(B, dtype=np.int32)
    ge = np.empty(B, dtype=bool)
    t_b, t_thr, t_v = torch.from_numpy(b), torch.from_numpy(thr), torch.from_numpy(v)
    for a in range(start, stop, B):
        n = min(B, stop - a)
        rn, fn, bn, vn, gn, ln = r[:n], f[:n], b[:n], v[:n], ge[:n], low[:n]
        get(a, rn.view(np.uint64))
        if int(rn.view(np.uint64).max()) >= total:  # no set: the payload is corrupt
            return False
        for step, (shift, thr_T, packed_T) in enumerate(steps):
            np.copyto(fn, rn, casting="unsafe")  # monotone and exact enough for a bucket
            np.right_shift(fn.view(np.int32), shift, out=bn)
            torch.index_select(thr_T, 0, t_b[:n], out=t_thr[:n])
            np.greater_equal(rn, thr[:n], out=gn)
            np.add(bn, gn, out=bn)
            torch.index_select(packed_T, 0, t_b[:n], out=t_v[:n])
            np.copyto(out_RK[a : a + n, TOP_K - 1 - step], vn, casting="unsafe")  # c: low byte
            np.right_shift(vn, 8, out=vn)
            np.subtract(rn, vn, out=rn)
        torch.index_select(last, 0, torch.from_numpy(rn), out=torch.from_numpy(ln))
        np.copyto(out_RK[a : a + n].view(np.uint16)[:, 0], ln, casting="unsafe")
        if m == 3:
            np.right_shift(ln, 16, out=ln)
            np.copyto(out_RK[a : a + n, 2], ln, casting="unsafe")
    return True
