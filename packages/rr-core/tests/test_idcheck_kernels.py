"""The two row-word kernels (numpy, and numba where it imports) give the same flags bit for bit,
and the flags a plain per-row reading gives; the kernel is chosen as documented; arming refuses
exactly the bad replayed rows with either."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import ReplayError, kernels
from rr_core.replay.checks import check_target_ids
from rr_core.routes import idcheck_numba
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


@pytest.mark.parametrize("kernel", ["numpy", pytest.param("numba", marks=needs_numba)])
@settings(max_examples=150, deadline=None)
@given(**ROWS, layers=st.integers(1, 5), data=st.data())
def test_arming_refuses_exactly_the_bad_replayed_rows(
    kernel: str, k: int, num_experts: int, rows: int, seed: int, layers: int, data: st.DataObject
) -> None:
    """The arming check (one compiled pass through the row index, the mask and the checked
    slots where numba runs; torch ops otherwise) refuses a micro-batch iff a replayed row of a
    checked slot is bad, and names one."""
    rng = np.random.default_rng(seed)
    e = min(max(num_experts, k), 256)  # good rows exist
    routes = np.argsort(rng.random((rows, layers, e)), -1)[..., :k].astype(np.uint8)
    bad_ones = data.draw(st.integers(0, 3))  # a few bad words among good ones
    where = rng.integers(0, [rows, layers], size=(bad_ones, 2))
    routes[where[:, 0], where[:, 1]] = draw_rows(rng, bad_ones, k, e)
    slots = sorted(data.draw(st.sets(st.integers(0, layers - 1), min_size=1)))
    mask = torch.from_numpy(rng.random(rows) < 0.8) if data.draw(st.booleans()) else None
    rows_T = torch.from_numpy(rng.integers(0, rows, rows)) if data.draw(st.booleans()) else None
    read = routes if rows_T is None else routes[rows_T.numpy()]
    bad = reference(read[:, slots].reshape(-1, k), e)[:2].any(0).reshape(-1, len(slots))
    if mask is not None:
        bad &= mask.numpy()[:, None]
    if kernel == "numba":  # the pass itself (a false alarm would only cost the torch path)
        assert idcheck_numba.any_bad(
            routes.view(words.WORDS[k])[..., 0],
            e,
            np.array([] if len(slots) == layers else slots, dtype=np.int64),
            np.zeros(0, np.int64) if rows_T is None else rows_T.numpy(),
            np.zeros(0, bool) if mask is None else mask.numpy(),
        ) == bool(bad.any())
    with kernels.use_kernel(kernel):
        call = lambda: check_target_ids(  # noqa: E731
            torch.from_numpy(routes),
            num_experts=e,
            replay_mask_T=mask,
            slot_layers={s: s + 1 for s in slots},
            microbatch=0,
            rows_T=rows_T,
        )
        if not bad.any():
            call()
            return
        row, column = np.argwhere(bad)[0]
        with pytest.raises(ReplayError, match=rf"layer {slots[column] + 1}, row {row}: "):
            call()
