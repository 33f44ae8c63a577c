"""Top-k sets as ranks in the combinatorial number system, vectorised and exact at any size.

Shape legend: R (token, MoE layer) pairs, K top-k, E experts, W 32-bit limbs of a rank.

The sorted set ``c_1 < ... < c_K`` has rank ``sum_i C(c_i, i)``, a bijection onto
``[0, C(E, K))``; ``ceil(log2 C(E, K))`` bits hold it, the information floor of an unordered
top-k. Ranks below ``2**62`` are plain int64 sums; larger ones (``C(512, 22)`` is about
``2**130``) are carried in 32-bit limbs with explicit carries and borrows, so nothing overflows.
The binomial table costs ``K * E * W * 8`` bytes per device; tables over ``MAX_TABLE_BYTES`` are
refused (use the ``packed`` codec there).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from rr_core.codecs.bitpack import MASK32, limbs_for
from rr_core.errors import CodecError

MAX_TABLE_BYTES = 64 << 20
_SINGLE_LIMIT = 1 << 62  # ranks below this are summed as plain int64


def set_width(num_experts: int, top_k: int) -> int:
    """Bits per top-k set: ``ceil(log2 C(E, K))`` (0 when there is only one set)."""
    return (math.comb(num_experts, top_k) - 1).bit_length()


def single_rank(num_experts: int, top_k: int) -> bool:
    """Whether every rank fits one int64 below ``2**62``."""
    return math.comb(num_experts, top_k) <= _SINGLE_LIMIT


@lru_cache(maxsize=32)
def _table_cpu(num_experts: int, top_k: int) -> torch.Tensor:
    """``C(c, i + 1)`` for ``i < K``, ``c < E``: int64 ``[K, E]``, or 32-bit limbs ``[K, E, W]``."""
    E, K = num_experts, top_k
    nl = 1 if single_rank(E, K) else limbs_for(set_width(E, K))
    size = K * E * nl * 8
    if size > MAX_TABLE_BYTES:
        raise CodecError(
            f"the set codec for num_experts={E}, top_k={K} needs a {size >> 20} MiB binomial "
            f"table (limit {MAX_TABLE_BYTES >> 20} MiB); use the 'packed' codec"
        )
    values = [math.comb(c, i + 1) for i in range(K) for c in range(E)]
    if nl == 1:
        return torch.tensor(values, dtype=torch.int64).reshape(K, E)
    limbs = [(v >> (32 * w)) & MASK32 for v in values for w in range(nl)]
    return torch.tensor(limbs, dtype=torch.int64).reshape(K, E, nl)


_TABLES: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _table(num_experts: int, top_k: int, device: torch.device) -> torch.Tensor:
    key = (num_experts, top_k, device)
    if key not in _TABLES:
        _TABLES[key] = _table_cpu(num_experts, top_k).to(device)
    return _TABLES[key]


def rank_sets(ids_RK: torch.Tensor, num_experts: int, *, single_out: bool = False) -> torch.Tensor:
    """Ranks of the id sets as int64 32-bit limbs ``[R, W]`` (W limbs of ``set_width`` bits), or
    with ``single_out`` (ranks below ``2**62`` only) as plain int64 ``[R]``.

    Ids must lie in ``[0, E)``; a row with a repeated id has no rank and raises.
    """
    K = ids_RK.shape[1]
    dev = ids_RK.device
    width = set_width(num_experts, K)
    cols_K = _sorted_columns(ids_RK)
    for i in range(K - 1):
        same_R = cols_K[i] == cols_K[i + 1]
        if bool(same_R.any()):
            r = int(same_R.nonzero()[0])
            raise CodecError(
                f"the set codec needs {K} distinct ids per row; row {r} holds {ids_RK[r].tolist()}"
            )
    table = _table(num_experts, K, dev)
    # One gather per sorted position: rank = sum_i C(c_i, i + 1).
    parts = (table[i].index_select(0, cols_K[i].to(torch.int32)) for i in range(K))
    if table.dim() == 2:
        rank_R = next(parts)
        for part_R in parts:
            rank_R += part_R
        if single_out:
            return rank_R
        if width <= 32:
            return rank_R[:, None]
        return torch.stack([rank_R & MASK32, rank_R >> 32], dim=1)
    nl = table.shape[2]
    limbs_RW = sum(parts, torch.zeros((ids_RK.shape[0], nl), dtype=torch.int64, device=dev))
    for w in range(nl - 1):  # each limb sums K values below 2**32: carry into the next
        limbs_RW[:, w + 1] += limbs_RW[:, w] >> 32
        limbs_RW[:, w] &= MASK32
    return limbs_RW


def _sorted_columns(ids_RK: torch.Tensor) -> list[torch.Tensor]:
    """The K columns of ``ids_RK`` sorted per row by an odd-even transposition network: K rounds
    of elementwise min/max on whole columns, much faster than a row-wise sort for small K."""
    K = ids_RK.shape[1]
    cols_K = [ids_RK[:, i].contiguous() for i in range(K)]  # a copy per column beats .t()
    for r in range(K):
        for i in range(r % 2, K - 1, 2):
            a, b = cols_K[i], cols_K[i + 1]
            cols_K[i], cols_K[i + 1] = torch.minimum(a, b), torch.maximum(a, b)
    return cols_K


def _sub_limbs(a_RW: torch.Tensor, b_RW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a - b mod 2**(32 W), a < b)`` on 32-bit limbs."""
    out_RW = a_RW - b_RW
    borrow_R = torch.zeros(a_RW.shape[0], dtype=torch.int64, device=a_RW.device)
    for w in range(a_RW.shape[1]):
        out_RW[:, w] -= borrow_R
        borrow_R = (out_RW[:, w] < 0).to(torch.int64)
        out_RW[:, w] += borrow_R << 32
    return out_RW, borrow_R.bool()


def _bucket(rank: torch.Tensor, bits: int) -> torch.Tensor:
    """A monotone bucket of each rank: its float32 exponent and top ``bits`` mantissa bits."""
    return rank.to(torch.float32).view(torch.int32) >> (23 - bits)


@lru_cache(maxsize=256)
def _greedy_cpu(num_experts: int, k: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tables that find the largest ``c`` with ``C(c, k) <= rank`` in one compare.

    With buckets fine enough that no two thresholds ``C(c, k)`` share one, a rank's ``c`` is the
    last threshold below its bucket (``base``) or the one inside it: ``base + (rank >= thr)``.
    Returns ``(bits, thr [buckets], sub [2 * buckets], val [2 * buckets])`` indexed by bucket
    and ``2 * bucket + (rank >= thr)``; ``sub`` is ``C(c, k)``, ``val`` is ``c``.
    """
    E = num_experts
    # C(E, k) closes the list: no rank reaches it, and the list is never empty.
    values = torch.tensor([math.comb(c, k) for c in range(k, E + 1)], dtype=torch.int64)
    top = torch.tensor([math.comb(E, k) - 1], dtype=torch.int64)
    for bits in range(1, 24):
        b_C = _bucket(values, bits).to(torch.int64)
        if bool((b_C[1:] > b_C[:-1]).all()):
            break
    size = int(_bucket(top, bits)) + 1
    beta = torch.arange(size, dtype=torch.int64)
    below = torch.searchsorted(b_C, beta)  # thresholds (c >= k) in lower buckets
    base = k - 1 + below  # C(k - 1, k) = 0 <= every rank
    nxt = below.clamp(max=b_C.numel() - 1)
    inside = b_C[nxt] == beta
    thr = torch.where(inside, values[nxt], torch.full_like(beta, _SINGLE_LIMIT))
    c_2B = torch.stack([base, (base + 1).clamp(max=E - 1)], dim=1).reshape(-1)
    sub = torch.tensor([math.comb(c, k) for c in c_2B.tolist()], dtype=torch.int64)
    return bits, thr, sub, c_2B


def unrank_sets(limbs_RW: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """Sorted ids int64 ``[R, K]`` of ranks given as :func:`rank_sets` limbs, on their device.

    Greedy: the largest ``c`` with ``C(c, i) <= rank`` is ``c_i``, for ``i = K .. 1``. Ranks at or
    above ``C(E, K)`` have no set and raise.
    """
    E, K = num_experts, top_k
    R, dev = limbs_RW.shape[0], limbs_RW.device
    if single_rank(E, K):
        rank_R = limbs_RW[:, 0] if limbs_RW.shape[1] == 1 else limbs_RW[:, 0] | limbs_RW[:, 1] << 32
        return unrank_single(rank_R, E, K)
    table = _table(E, K, dev)
    out_RK = torch.empty((R, K), dtype=torch.int64, device=dev)
    total = math.comb(E, K)
    total_1W = torch.tensor([[(total >> (32 * w)) & MASK32 for w in range(limbs_RW.shape[1])]])
    _, in_range_R = _sub_limbs(limbs_RW, total_1W.to(dev))
    if not bool(in_range_R.all()):
        raise CodecError(f"a set rank is >= C({E}, {K}); the payload is corrupt")
    rank_RW = limbs_RW.clone()
    for i in range(K - 1, -1, -1):
        lo_R = torch.full((R,), i, dtype=torch.int64, device=dev)  # C(i, i+1) = 0 <= any rank
        hi_R = torch.full((R,), E - 1, dtype=torch.int64, device=dev)
        for _ in range(E.bit_length()):
            mid_R = (lo_R + hi_R + 1) // 2
            _, below_R = _sub_limbs(rank_RW, table[i][mid_R])
            lo_R = torch.where(below_R, lo_R, mid_R)
            hi_R = torch.where(below_R, mid_R - 1, hi_R)
        out_RK[:, i] = lo_R
        rank_RW, _ = _sub_limbs(rank_RW, table[i][lo_R])
    return out_RK


_GREEDY: dict[tuple[int, int, torch.device], tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]
_GREEDY = {}


def unrank_single(rank_R: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """:func:`unrank_sets` of int64 ranks below ``2**62``: one bucket lookup and one compare per
    position instead of a binary search."""
    E, K = num_experts, top_k
    R, dev = rank_R.shape[0], rank_R.device
    if R and int(rank_R.max()) >= math.comb(E, K):
        raise CodecError(f"a set rank is >= C({E}, {K}); the payload is corrupt")
    cols_K: list[torch.Tensor] = []
    rank_R = rank_R.clone()
    for i in range(K - 1, 0, -1):
        key = (E, i + 1, dev)
        if key not in _GREEDY:
            _GREEDY[key] = tuple(  # type: ignore[assignment]
                t if isinstance(t, int) else t.to(dev) for t in _greedy_cpu(E, i + 1)
            )
        bits, thr_B, sub_J, val_J = _GREEDY[key]
        b_R = _bucket(rank_R, bits)
        j_R = torch.add(rank_R >= thr_B.index_select(0, b_R), b_R, alpha=2)
        rank_R -= sub_J.index_select(0, j_R)
        cols_K.append(val_J.index_select(0, j_R))
    cols_K.append(rank_R)  # C(c, 1) = c
    return torch.stack(cols_K[::-1], dim=1)  # one interleave, not K strided column writes
