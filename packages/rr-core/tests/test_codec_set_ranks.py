"""The set codec's ranks: a bijection in colex order, exact for big sets, and the fast unranking
exact at every table threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rr_core.codecs.sets import rank_sets, set_width, unrank_sets


def test_set_ranks_are_a_bijection_in_colex_order() -> None:
    import itertools

    combos = list(itertools.combinations(range(7), 3))
    ids = torch.tensor(combos)
    ranks = rank_sets(ids, 7)[:, 0].tolist()
    assert sorted(ranks) == list(range(math.comb(7, 3)))
    assert torch.equal(unrank_sets(rank_sets(ids, 7), 7, 3), ids)


@pytest.mark.parametrize(("E", "K"), [(512, 22), (384, 22), (257, 20), (128, 60)])
def test_big_ranks_are_exact(E: int, K: int) -> None:
    rng = np.random.default_rng(E + K)
    sets = np.sort(rng.random((50, E)).argsort(axis=1)[:, :K], axis=1)
    sets[0] = np.arange(E - K, E)  # the largest set: rank C(E, K) - 1
    sets[1] = np.arange(K)  # the smallest: rank 0
    limbs = rank_sets(torch.from_numpy(sets), E)
    for row, s in zip(limbs.tolist(), sets.tolist(), strict=True):
        value = sum(limb << (32 * i) for i, limb in enumerate(row))
        assert value == sum(math.comb(c, i + 1) for i, c in enumerate(s))
    assert sum(v << (32 * i) for i, v in enumerate(limbs[0].tolist())) == math.comb(E, K) - 1
    assert torch.equal(unrank_sets(limbs, E, K), torch.from_numpy(sets))
    assert set_width(E, K) == (math.comb(E, K) - 1).bit_length()


def test_set_unranking_is_exact_for_every_small_set() -> None:
    import itertools

    for E in range(1, 12):
        for K in range(1, E + 1):
            ids = torch.tensor(list(itertools.combinations(range(E), K)))
            limbs = rank_sets(ids, E)
            assert torch.equal(rank_sets(ids, E, single_out=True), limbs[:, 0])
            assert torch.equal(unrank_sets(limbs, E, K), ids)


@pytest.mark.parametrize("E", [60, 128, 185, 186, 256])
def test_fast_unranking_at_every_threshold(E: int) -> None:
    """Ranks next to every ``C(c, k)`` and to sums of them: each bucket, threshold compare and
    the last-ids table agree with the general unranking."""
    from rr_core.codecs.sets import unrank_single
    from rr_core.codecs.sets_fast import _last_ids, unrank_fast

    m, last = _last_ids(E)
    assert m == (3 if E <= 185 else 2)
    ids = last.numpy()
    c = [(ids >> (8 * i)) & 0xFF for i in range(m)]
    ranks = sum(np.array([math.comb(int(x), i + 1) for x in col]) for i, col in enumerate(c))
    assert np.array_equal(ranks, np.arange(math.comb(E, m)))  # entry r holds the set of rank r
    total = math.comb(E, 8)
    near = {math.comb(x, k) + d for k in range(1, 9) for x in range(E + 1) for d in (-1, 0, 1)}
    near |= {math.comb(x, 8) + math.comb(y, 7) + d for x in range(E) for y in range(0, x, 5)
             for d in (-1, 0, 1)}  # fmt: skip
    ranks_R = torch.tensor(sorted(v for v in near if 0 <= v < total), dtype=torch.int64)
    out = unrank_fast(ranks_R, E)
    assert torch.equal(out.to(torch.int64), unrank_single(ranks_R, E, 8))


@pytest.mark.parametrize("E", [8, 60, 128, 160, 256])
def test_fast_unrank_tables_step_one_bucket_past_a_threshold(E: int) -> None:
    """``bucket + (rank >= thr)`` indexes the same entry as the general ``2 * bucket + ...``."""
    from rr_core.codecs.sets import _greedy_cpu
    from rr_core.codecs.sets_fast import _unrank_tables

    for (shift, thr, packed), k in zip(_unrank_tables(E), range(8, 0, -1), strict=False):
        bits, thr_ref, sub, val = _greedy_cpu(E, k)
        assert shift == 23 - bits
        assert torch.equal(thr, thr_ref)
        ref = (sub << 8) | val
        real = (thr < 1 << 62).nonzero()[:, 0]  # buckets holding a threshold
        assert torch.equal(packed[:-1], ref[0::2])
        assert torch.equal(packed[real + 1], ref[2 * real + 1])
