"""A CPU fast path of the set codec for top-8 uint8 ids (``E <= 256``), bit-identical to
:mod:`rr_core._codec_set`.

Shape legend: R (token, MoE layer) pairs, B rows of one block, K = 8 top-k, E experts.

Rows are handled in blocks of ``BLOCK`` so that every temporary stays in cache; the work inside a
block is a few dozen numpy operations over whole columns, never a loop over rows.

- Ranking: the block's K id columns are copied out and sorted by Batcher's odd-even merge network
  (19 elementwise min/max pairs on uint8). Sorted positions ``(2p, 2p + 1)`` then index a table of
  ``C(a, 2p + 1) + C(b, 2p + 2)``, four gathers per row in all. Pairs with ``a >= b`` (a repeated
  id) hold ``DUP``, which no sum of true ranks reaches.
- Unranking: greedy from ``c_8`` down to ``c_3``, each position one bucket of the float32 rank, one
  threshold compare and one gather of ``C(c, k) << 8 | c``; the last two positions come from one
  table indexed by the remaining rank, below ``C(E, 2)``. The ids accumulate in one uint64 word per
  row (``c_1`` lowest), viewed as uint8 ``[R, 8]`` at the end: no column interleave.
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache

import numpy as np
import torch

from rr_core._codec_set import _greedy_cpu

BLOCK = 1 << 16
TOP_K = 8
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
        and sys.byteorder == "little"  # the uint64 word of a row is its 8 bytes, c_1 lowest
        and _buckets_agree(num_experts)
    )


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


def rank_fast(ids_RK: torch.Tensor, num_experts: int) -> torch.Tensor | None:
    """Ranks int64 ``[R]`` of uint8 id rows ``[R, 8]``, or None if a row repeats an id."""
    R = ids_RK.shape[0]
    shift, tables = _pair_tables(num_experts)
    src = ids_RK.contiguous().numpy()
    out = np.empty(R, dtype=np.int64)
    B = min(BLOCK, R)
    cols = [np.empty(B, dtype=np.uint8) for _ in range(TOP_K + 1)]
    cols_KB = np.empty((TOP_K, B), dtype=np.uint8)
    idx = np.empty(B, dtype=np.int32)
    part = np.empty(B, dtype=np.int64)
    same = np.empty(B, dtype=bool)
    t_idx, t_part = torch.from_numpy(idx), torch.from_numpy(part)
    t_tables = [torch.from_numpy(t) for t in tables]
    for a in range(0, R, B):
        n = min(B, R - a)
        np.copyto(cols_KB[:, :n], src[a : a + n].T)
        c = [cols_KB[i, :n] for i in range(TOP_K)]
        spare = cols[TOP_K][:n]
        for i, j in _NETWORK:  # c[i], c[j] <- min, max
            np.minimum(c[i], c[j], out=spare)
            np.maximum(c[i], c[j], out=c[j])
            c[i], spare = spare, c[i]
        for i in (1, 3, 5):  # pairs inside the table flag a repeat themselves
            if np.equal(c[i], c[i + 1], out=same[:n]).any():
                return None
        acc = out[a : a + n]
        t_acc = torch.from_numpy(acc)
        for p in range(TOP_K // 2):
            np.left_shift(c[2 * p + 1], shift, out=idx[:n], dtype=np.int32)
            np.bitwise_or(idx[:n], c[2 * p], out=idx[:n])
            dst = t_acc if p == 0 else t_part[:n]
            torch.index_select(t_tables[p], 0, t_idx[:n], out=dst)
            if p:
                np.add(acc, part[:n], out=acc)
    if R and int(out.max()) >= DUP:
        return None
    return torch.from_numpy(out)


@lru_cache(maxsize=16)
def _unrank_tables(num_experts: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Per position ``k = 8 .. 3``: ``(bits, thr [buckets], C(c, k) << 8 | c [2 * buckets])``."""
    out = []
    for k in range(TOP_K, 2, -1):
        bits, thr, sub, val = _greedy_cpu(num_experts, k)
        out.append((23 - bits, thr, (sub << 8) | val))
    return out


@lru_cache(maxsize=16)
def _last_two(num_experts: int) -> torch.Tensor:
    """``c_1 | c_2 << 8`` (int64) of every rank ``C(c_2, 2) + c_1`` below ``C(E, 2)``."""
    c2 = [b for b in range(num_experts) for _ in range(b)]
    c1 = [a for b in range(num_experts) for a in range(b)]
    return torch.tensor(c1, dtype=torch.int64) | torch.tensor(c2, dtype=torch.int64) << 8


def unrank_fast(rank_R: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Sorted uint8 ids ``[R, 8]`` of int64 ranks below ``C(E, 8)`` (the caller checks)."""
    R = rank_R.shape[0]
    steps = _unrank_tables(num_experts)
    last = _last_two(num_experts)
    words = np.empty(R, dtype=np.uint64)
    B = min(BLOCK, R)
    r = np.empty(B, dtype=np.int64)
    f = np.empty(B, dtype=np.float32)
    b = np.empty(B, dtype=np.int32)
    thr = np.empty(B, dtype=np.int64)
    v = np.empty(B, dtype=np.int64)
    ge = np.empty(B, dtype=bool)
    t_b, t_thr, t_v = torch.from_numpy(b), torch.from_numpy(thr), torch.from_numpy(v)
    src = rank_R.numpy()
    for a in range(0, R, B):
        n = min(B, R - a)
        rn, fn, bn, vn, gn = r[:n], f[:n], b[:n], v[:n], ge[:n]
        w = words[a : a + n].view(np.int64)
        np.copyto(rn, src[a : a + n])
        for step, (shift, thr_T, packed_T) in enumerate(steps):
            np.copyto(fn, rn, casting="unsafe")  # monotone and exact enough for a bucket
            np.right_shift(fn.view(np.int32), shift, out=bn)
            torch.index_select(thr_T, 0, t_b[:n], out=t_thr[:n])
            np.greater_equal(rn, thr[:n], out=gn)
            np.left_shift(bn, 1, out=bn)
            np.add(bn, gn, out=bn)
            torch.index_select(packed_T, 0, t_b[:n], out=t_v[:n])
            if step:
                np.left_shift(w, 8, out=w)
                np.bitwise_or(w, vn & 0xFF, out=w)
            else:
                np.bitwise_and(vn, 0xFF, out=w)
            np.right_shift(vn, 8, out=vn)
            np.subtract(rn, vn, out=rn)
        torch.index_select(last, 0, torch.from_numpy(rn), out=t_v[:n])
        np.left_shift(w, 16, out=w)
        np.bitwise_or(w, vn, out=w)
    return torch.from_numpy(words.view(np.uint8).reshape(R, TOP_K))
