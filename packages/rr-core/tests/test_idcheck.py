"""The word-level row checks agree with the column comparisons on every row, and both find what
a plain per-row reading finds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core.routes import idcheck_words as _idcheck_words
from rr_core.routes.idcheck import column_flags, row_flags


def naive(ids_RK: torch.Tensor, num_experts: int) -> list[tuple[bool, bool, bool]]:
    rows = ids_RK.reshape(-1, ids_RK.shape[-1]).tolist()
    return [(max(r) >= num_experts or min(r) < 0, len(set(r)) < len(r), any(r)) for r in rows]


def flags_list(flags: tuple[torch.Tensor, ...]) -> list[tuple[bool, bool, bool]]:
    return list(zip(*(f.tolist() for f in flags), strict=True))


@settings(max_examples=200, deadline=None)
@given(
    k=st.sampled_from([2, 4, 8]),
    num_experts=st.sampled_from([8, 60, 64, 127, 128, 129, 160, 255, 256]),
    rows=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_word_flags_match_columns_and_rows(k: int, num_experts: int, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, size=(rows, k), dtype=np.uint8)
    distinct = rng.random(rows) < 0.5  # half the rows are true top-k rows of [0, E)
    ids[distinct] = np.argsort(rng.random((int(distinct.sum()), num_experts)), axis=1)[:, :k]
    ids[rng.random(rows) < 0.1] = 0
    close = rng.random(rows) < 0.2  # ids right at the range boundary
    ids[close] = np.clip(num_experts - 1 + rng.integers(0, 2, (int(close.sum()), k)), 0, 255)
    t = torch.from_numpy(ids)
    assert _idcheck_words.covers(t)
    words = flags_list(row_flags(t, num_experts))
    assert words == flags_list(column_flags(t, num_experts))
    assert words == naive(t, num_experts)


@settings(max_examples=150, deadline=None)
@given(
    k=st.sampled_from([2, 4, 8]),
    dtype=st.sampled_from([torch.int16, torch.int32, torch.int64]),
    num_experts=st.sampled_from([8, 64, 128, 129, 200, 256]),
    rows=st.integers(1, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_wide_ids_narrowed_to_words_match_a_plain_reading(
    k: int, dtype: torch.dtype, num_experts: int, rows: int, seed: int
) -> None:
    """verl's int16 rows (and int32 / int64) go through the byte-word checks; ids that do not
    survive the narrowing (negative, 256 + i) are out of range, never mistaken for id i."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((rows, num_experts)), axis=1)[:, :k].astype(np.int64)
    wrap = rng.random((rows, k)) < 0.05
    ids[wrap] += rng.choice([256, -256, 512, 65536 if dtype != torch.int16 else -512], wrap.sum())
    ids[rng.random((rows, k)) < 0.05] = -1
    ids[rng.random(rows) < 0.1] = 0
    t = torch.from_numpy(ids).to(dtype)
    assert _idcheck_words.covers_narrowed(t)
    got, want = flags_list(row_flags(t, num_experts)), naive(t, num_experts)
    assert [g[0] for g in got] == [w[0] for w in want]  # out of range
    assert [g[2] for g in got] == [w[2] for w in want]  # non-zero
    assert [g[1] for g, w in zip(got, want, strict=True) if not w[0]] == [  # repeats, in range
        w[1] for w in want if not w[0]
    ]


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.uint8])
def test_other_rows_take_the_column_path(dtype: torch.dtype) -> None:
    ids = torch.tensor([[0, 1, 2], [3, 3, 1], [0, 0, 0], [5, 1, 9]], dtype=dtype)
    assert not _idcheck_words.covers(ids)
    assert flags_list(row_flags(ids, 6)) == naive(ids, 6)


@pytest.mark.parametrize("threads", [1, 2])
def test_chunks_cover_every_row(threads: int, torch_threads: Callable[[int], None]) -> None:
    """Rows past the first in-cache chunk, and in the second thread's range, are checked."""
    torch_threads(threads)
    n = 3 * _idcheck_words.CHUNK + 5
    ids = torch.arange(8, dtype=torch.uint8).repeat(n, 1)
    ids[-1, 7] = 0  # a repeat in the very last row
    ids[2 * _idcheck_words.CHUNK, 0] = 200  # out of range in a later chunk
    out_of_range, repeated, nonzero = row_flags(ids, 128)
    assert repeated.nonzero().flatten().tolist() == [n - 1]
    assert out_of_range.nonzero().flatten().tolist() == [2 * _idcheck_words.CHUNK]
    assert bool(nonzero.all())
