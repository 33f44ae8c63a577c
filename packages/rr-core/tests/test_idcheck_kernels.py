"""The two row-word kernels (numpy, and numba where it imports) give the same flags bit for bit,
and the flags a plain per-row reading gives; the kernel is chosen as documented."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import kernels
from rr_core.routes import idcheck_words as words

needs_numba = pytest.mark.skipif(not kernels.numba_available(), reason="numba is not installed")


def reference(ids_RK: np.ndarray, num_experts: int) -> np.ndarray:
    """``[3, R]`` flags read row by row: an id >= E, a repeated id, a non-zero id."""
    rows = ids_RK.tolist()
    flags = [(max(r) >= num_experts, len(set(r)) < len(r), any(r)) for r in rows]
    return np.array(flags, dtype=bool).reshape(-1, 3).T


def flags(ids_RK: np.ndarray, num_experts: int, kernel: str) -> np.ndarray:
    with kernels.use_kernel(kernel):
        return np.stack(
            [f.numpy() for f in words.word_flags(torch.from_numpy(ids_RK), num_experts)]
        )


def draw_rows(rng: np.random.Generator, rows: int, k: int, num_experts: int) -> np.ndarray:
    """Top-k rows of [0, E), rows repeating one id, zero rows and ids around E."""
    ids = rng.integers(0, 256, size=(rows, k), dtype=np.uint8)
    distinct = rng.random(rows) < 0.5
    ids[distinct] = np.argsort(rng.random((int(distinct.sum()), min(max(num_experts, k), 256))), 1)[
        :, :k
    ]
    repeat = np.flatnonzero(rng.random(rows) < 0.2)  # one id copied to another place in the row
    if repeat.size:
        src, dst = rng.integers(0, k, repeat.size), rng.integers(0, k, repeat.size)
        ids[repeat, dst] = ids[repeat, src]
    ids[rng.random(rows) < 0.1] = 0
    close = rng.random((rows, k)) < 0.1
    ids[close] = np.clip(num_experts - 1 + rng.integers(0, 2, int(close.sum())), 0, 255)
    return ids


EXPERTS = [1, 2, 8, 60, 64, 127, 128, 129, 160, 200, 255, 256, 300]


#: Id rows drawn per example: top-k, expert count (both sides of every dtype edge), rows, seed.
ROWS = {
    "k": st.sampled_from([2, 4, 8]),
    "num_experts": st.sampled_from(EXPERTS),
    "rows": st.integers(1, 400),
    "seed": st.integers(0, 2**32 - 1),
}


@pytest.mark.parametrize("kernel", ["numpy", pytest.param("numba", marks=needs_numba)])
@settings(max_examples=300, deadline=None)
@given(**ROWS)
def test_kernel_matches_a_plain_reading_and_numpy_bit_for_bit(
    kernel: str, k: int, num_experts: int, rows: int, seed: int
) -> None:
    ids = draw_rows(np.random.default_rng(seed), rows, k, num_experts)
    got = flags(ids, num_experts, kernel)
    assert np.array_equal(got, reference(ids, num_experts))
    if kernel != "numpy":
        assert np.array_equal(got, flags(ids, num_experts, "numpy"))


@settings(max_examples=200, deadline=None)
@given(
    row=st.lists(st.integers(0, 255), min_size=8, max_size=8), num_experts=st.sampled_from(EXPERTS)
)
def test_every_byte_pattern_of_one_row(row: list[int], num_experts: int) -> None:
    """Any 8 bytes, as hypothesis shrinks them (ids equal at every distance, 0 and 255)."""
    ids = np.array([row], dtype=np.uint8)
    want = reference(ids, num_experts)
    for kernel in kernels.KERNELS if kernels.numba_available() else ("numpy",):
        assert np.array_equal(flags(ids, num_experts, kernel), want), kernel


@pytest.mark.parametrize("kernel", [pytest.param("numba", marks=needs_numba), "numpy"])
@pytest.mark.parametrize("threads", [1, 3])
def test_rows_of_every_thread_are_checked(
    kernel: str, threads: int, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    n = 3 * words.CHUNK + 5
    ids = np.tile(np.arange(8, dtype=np.uint8), (n, 1))
    ids[-1, 7] = 3  # a repeat in the last row
    ids[2 * words.CHUNK + 1, 0] = 200  # out of range in the last thread's range
    out_of_range, repeated, nonzero = flags(ids, 128, kernel)
    assert np.flatnonzero(repeated).tolist() == [n - 1]
    assert np.flatnonzero(out_of_range).tolist() == [2 * words.CHUNK + 1]
    assert nonzero.all()


def test_default_kernel_is_numba_where_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernels.kernel() == ("numba" if kernels.numba_available() else "numpy")
    monkeypatch.setattr(kernels, "_NUMBA", [None])  # numba does not import
    assert kernels.kernel() == "numpy"
    with pytest.raises(ImportError, match=r"rr-core\[numba\]"), kernels.use_kernel("numba"):
        pass


def test_an_unknown_kernel_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_CHOSEN", ["cuda"])  # RR_KERNEL=cuda
    with pytest.raises(ValueError, match="RR_KERNEL must be one of"):
        kernels.kernel()
