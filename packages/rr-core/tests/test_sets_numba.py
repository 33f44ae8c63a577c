"""The compiled set kernel writes the stream of the general ranking and packing bit for bit, on
any thread count, and refuses what the general path reports."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import kernels
from rr_core.codecs.bitpack import pack_fields
from rr_core.codecs.encoding import encode_payload
from rr_core.codecs.sets import rank_sets, set_width

pytestmark = pytest.mark.skipif(not kernels.numba_available(), reason="numba is not installed")


def reference(ids_RK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The general path: exact integer ranks, packed field by field."""
    return pack_fields(rank_sets(ids_RK, num_experts, single_out=True), set_width(num_experts, 8))


def rows(rng: np.random.Generator, count: int, num_experts: int) -> torch.Tensor:
    ids = np.argsort(rng.random((count, num_experts)), axis=1)[:, :8].astype(np.uint8)
    if count >= 2:
        ids[0], ids[1] = np.arange(num_experts - 8, num_experts), np.arange(8)  # extremes
    return torch.from_numpy(ids)


@pytest.mark.parametrize("num_experts", [9, 60, 128, 185, 186, 256])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_stream_is_the_general_one_on_any_thread_count(
    num_experts: int, threads: int, torch_threads: Callable[[int], None]
) -> None:
    from rr_core.codecs import sets_numba

    torch_threads(threads)
    ids_RK = rows(np.random.default_rng(num_experts), 64 * 37 + 29, num_experts)
    got = sets_numba.rank_pack(ids_RK, num_experts, set_width(num_experts, 8))
    assert got is not None
    assert torch.equal(got, reference(ids_RK, num_experts))


@settings(max_examples=150, deadline=None)
@given(
    count=st.integers(1, 300),
    num_experts=st.integers(9, 256),  # 8 of 8 is one set: no payload
    seed=st.integers(0, 2**32 - 1),
)
def test_any_row_count_and_expert_count(count: int, num_experts: int, seed: int) -> None:
    from rr_core.codecs import sets_numba

    ids_RK = rows(np.random.default_rng(seed), count, num_experts)
    got = sets_numba.rank_pack(ids_RK, num_experts, set_width(num_experts, 8))
    assert got is not None
    assert torch.equal(got, reference(ids_RK, num_experts))


@pytest.mark.parametrize("fault", ["repeat", "out_of_range"])
@pytest.mark.parametrize("row", [0, 64 * 5 + 3, 64 * 9])
def test_a_bad_row_in_any_range_is_refused(
    fault: str, row: int, torch_threads: Callable[[int], None]
) -> None:
    from rr_core.codecs import sets_numba

    torch_threads(2)
    ids_RK = rows(np.random.default_rng(row), 64 * 9 + 1, 128).clone()
    if fault == "repeat":
        ids_RK[row, 5] = ids_RK[row, 2]
    else:
        ids_RK[row, 7] = 128
    assert sets_numba.rank_pack(ids_RK, 128, set_width(128, 8)) is None


def test_the_codec_runs_the_kernel_numba_picks_and_both_agree() -> None:
    """encode_payload under either kernel family: the same bytes."""
    from rr_core import RouteMeta

    meta = RouteMeta(num_experts=128, top_k=8, layer_axis="moe_layers", layer_numbers=(1, 2, 3))
    ids_RK = rows(np.random.default_rng(3), 3 * 1000, 128)
    rows_VMK = ids_RK.reshape(1000, 3, 8)
    with kernels.use_kernel("numba"):
        compiled = encode_payload(rows_VMK, "set", meta)
    with kernels.use_kernel("numpy"):
        twin = encode_payload(rows_VMK, "set", meta)
    assert torch.equal(compiled, twin)
    assert compiled.numel() == math.ceil(3000 * set_width(128, 8) / 8)
