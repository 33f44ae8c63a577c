"""The compiled decoders (numba, where it imports) and the numpy ones return the same ids bit for
bit from streams the reference encoders write; decode_routes_into writes them into a caller's
layout exactly where decode_routes' batch holds them, and refuses a layout that cannot hold them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import CodecError, EncodedRoutes, RouteBatch, RouteMeta, kernels
from rr_core.codecs.bitpack import pack_bits, pack_fields
from rr_core.codecs.bitpack_bytes import _encode_torch, unpack_byte_ids
from rr_core.codecs.encoding import (
    CODECS,
    decode_routes,
    decode_routes_into,
    encode_routes,
)
from rr_core.codecs.sets import rank_sets, set_width

FAMILIES = kernels.KERNELS if kernels.numba_available() else ("numpy",)
needs_numba = pytest.mark.skipif(not kernels.numba_available(), reason="numba is not installed")


def distinct_ids(rng: np.random.Generator, rows: int, num_experts: int, top_k: int) -> np.ndarray:
    return np.argsort(rng.random((rows, num_experts)), axis=1)[:, :top_k]


def reference_byte_stream(ids_n: torch.Tensor, width: int) -> torch.Tensor:
    """The byte-group layout by its reference encoder: whole groups, then a plain bit stream."""
    G = ids_n.numel() // 8
    groups = _encode_torch(ids_n[: 8 * G].view(G, 8), width).reshape(-1)
    tail = pack_bits(ids_n[8 * G :].to(torch.int64)[:, None], width)
    return torch.cat([groups, tail])


def decode_with(kernel: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with kernels.use_kernel(kernel):
        return fn().clone()


@settings(max_examples=80, deadline=None)
@given(width=st.integers(1, 7), count=st.integers(0, 600), seed=st.integers(0, 2**32 - 1))
def test_byte_groups_decode_alike_under_every_kernel(width: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, 1 << width, count).astype(np.uint8))
    stream = reference_byte_stream(ids, width)
    for kernel in FAMILIES:
        assert torch.equal(decode_with(kernel, lambda: unpack_byte_ids(stream, count, width)), ids)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("width", [1, 3, 6, 7])
def test_byte_groups_over_several_threads(
    width: int, threads: int, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    ids = torch.from_numpy(np.random.default_rng(width).integers(0, 1 << width, 8 * 5000 + 5))
    ids = ids.to(torch.uint8)
    stream = reference_byte_stream(ids, width)
    for kernel in FAMILIES:
        assert torch.equal(
            decode_with(kernel, lambda: unpack_byte_ids(stream, ids.numel(), width)), ids
        )


def set_payload(ids_RK: np.ndarray, num_experts: int) -> torch.Tensor:
    """The set stream by the general ranking and packing (what rr has always written)."""
    ranks = rank_sets(torch.from_numpy(ids_RK), num_experts, single_out=True)
    return pack_fields(ranks, set_width(num_experts, ids_RK.shape[1]))


def set_batch(
    rng: np.random.Generator,
    num_experts: int,
    top_k: int,
    rows: int,
    *,
    dense: tuple[int, ...] = (),
    layers: int = 3,
    valid_share: float = 1.0,
) -> RouteBatch:
    moe = tuple(n for n in range(1, layers + 1) if n not in dense)
    values = np.zeros((rows, layers, top_k), dtype=np.int64)
    ids = distinct_ids(rng, rows * len(moe), num_experts, top_k).reshape(rows, len(moe), top_k)
    values[:, [n - 1 for n in moe]] = ids
    valid = rng.random(rows) < valid_share
    values[~valid] = 0
    meta = RouteMeta(
        num_experts=num_experts,
        top_k=top_k,
        layer_axis="all_layers" if dense else "moe_layers",
        layer_numbers=tuple(range(1, layers + 1)),
        moe_layer_numbers=moe if dense else None,
    )
    dtype = torch.uint8 if num_experts <= 256 else torch.int16
    tensor = torch.from_numpy(values).to(dtype)
    return RouteBatch(tensor, [0, rows], torch.from_numpy(valid), meta, allow_all_zero=True)


@settings(max_examples=60, deadline=None)
@given(
    num_experts=st.integers(9, 256),
    rows=st.integers(1, 700),
    dense=st.sampled_from([(), (2,), (1, 4)]),
    valid_share=st.sampled_from([1.0, 0.6]),
    seed=st.integers(0, 2**32 - 1),
)
def test_top8_sets_decode_alike_under_every_kernel(
    num_experts: int, rows: int, dense: tuple[int, ...], valid_share: float, seed: int
) -> None:
    """The compiled path covers top-8 byte ids; dense slots and invalid rows decode as zeros."""
    batch = set_batch(
        np.random.default_rng(seed), num_experts, 8, rows, dense=dense, layers=4,
        valid_share=valid_share,
    )  # fmt: skip
    encoded = encode_routes(batch, "set")
    want = batch.values_NLK.sort(dim=-1).values
    for kernel in FAMILIES:
        got = decode_with(kernel, lambda: decode_routes(encoded).values_NLK)
        assert torch.equal(got, want), kernel


def every_row_valid(rows: int) -> torch.Tensor:
    """A validity bitmap (row i: bit i % 8 of byte i // 8) with every row set."""
    return torch.from_numpy(np.packbits(np.ones(rows, dtype=bool), bitorder="little"))


def threshold_sets(E: int) -> set[tuple[int, ...]]:
    """For every position k and id c: sets whose rank left at position k (after the ids above
    it) is exactly ``C(c, k)`` (ids below c the least) or one less (position k holds c - 1, the
    ids below it the largest), with the ids above the least or the largest there are. Each
    position's step must find c, or c - 1, right at its threshold."""
    out = set()
    for k in range(1, 9):
        for c in range(k, E - (8 - k)):
            for above in (range(c + 1, c + 9 - k), range(E - (8 - k), E)):
                out.add((*range(k - 1), c, *above))
                out.add((*range(c - k, c), *above))
    return out


@pytest.mark.parametrize("num_experts", [9, 128, 185, 186, 256])
def test_the_extreme_sets_decode(num_experts: int) -> None:
    """The first set, the last set, the ones around every position's largest id, and the ones at
    and just below every position's every threshold."""
    E = num_experts
    extremes = {tuple(range(8)), tuple(range(E - 8, E))}
    extremes |= {(*range(7), c) for c in (7, (E + 6) // 2, E - 1)}  # the least ids below
    extremes |= {(c, *range(E - 7, E)) for c in (0, (E - 8) // 2, E - 8)}  # the largest above
    extremes = sorted(extremes | threshold_sets(E))
    ids = np.sort(np.array(extremes, dtype=np.int64), axis=1)
    payload = set_payload(ids, E)
    meta = RouteMeta(num_experts=E, top_k=8, layer_axis="moe_layers", layer_numbers=(1,))
    encoded = EncodedRoutes(
        codec="set",
        meta=meta,
        num_rows=len(ids),
        offsets_B1=torch.tensor([0, len(ids)]),
        valid_bits=every_row_valid(len(ids)),
        payload=payload,
    )
    for kernel in FAMILIES:
        got = decode_with(kernel, lambda: decode_routes(encoded).values_NLK[:, 0])
        assert torch.equal(got.to(torch.int64), torch.from_numpy(ids)), kernel


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sets_over_several_threads_land_in_order(
    threads: int, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    batch = set_batch(np.random.default_rng(threads), 128, 8, 3000, layers=5, valid_share=0.8)
    encoded = encode_routes(batch, "set")
    for kernel in FAMILIES:
        got = decode_with(kernel, lambda: decode_routes(encoded).values_NLK)
        assert torch.equal(got, batch.values_NLK.sort(dim=-1).values), kernel


def test_an_unaligned_payload_decodes() -> None:
    """A payload read from a file may start at any byte of its buffer."""
    batch = set_batch(np.random.default_rng(7), 128, 8, 500)
    for codec in CODECS:
        encoded = encode_routes(batch, codec)
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), encoded.payload])[1:]
        assert shifted.data_ptr() % 8
        moved = dataclasses.replace(encoded, payload=shifted)
        for kernel in FAMILIES:
            got = decode_with(kernel, lambda m=moved: decode_routes(m).values_NLK)
            assert torch.equal(got, decode_routes(encoded).values_NLK), (codec, kernel)


@needs_numba
@pytest.mark.parametrize("at", ["first", "last"])
def test_a_corrupt_rank_is_refused_by_the_compiled_decoder(at: str) -> None:
    E = 128
    ids = distinct_ids(np.random.default_rng(0), 2000, E, 8)
    ranks = rank_sets(torch.from_numpy(ids), E, single_out=True)
    ranks[0 if at == "first" else -1] = math.comb(E, 8)  # one past the last set
    meta = RouteMeta(num_experts=E, top_k=8, layer_axis="moe_layers", layer_numbers=(1,))
    encoded = EncodedRoutes(
        codec="set",
        meta=meta,
        num_rows=2000,
        offsets_B1=torch.tensor([0, 2000]),
        valid_bits=torch.full((250,), 255, dtype=torch.uint8),
        payload=pack_fields(ranks, set_width(E, 8)),
    )
    for kernel in FAMILIES:
        with kernels.use_kernel(kernel), pytest.raises(CodecError, match=r"C\(128, 8\).*corrupt"):
            decode_routes(encoded)


layouts = st.tuples(
    st.sampled_from([8, 60, 128, 256, 257, 512]),  # experts
    st.integers(1, 16),  # top-k
    st.sampled_from([(), (1,), (2, 3)]),  # dense layers of 4
    st.sampled_from([torch.int16, torch.int32, torch.int64]),
)


@settings(max_examples=60, deadline=None)
@given(layout=layouts, codec=st.sampled_from(CODECS), rows=st.integers(0, 40), seed=st.integers())
def test_decode_into_a_padded_layout_equals_decode_routes(
    layout: tuple[int, int, tuple[int, ...], torch.dtype], codec: str, rows: int, seed: int
) -> None:
    """Valid rows placed at arbitrary output rows, in a wider dtype, with rows between them."""
    E, K, dense, dtype = layout
    K = min(K, E)
    rng = np.random.default_rng(seed % 2**32)
    batch = set_batch(rng, E, K, rows, dense=dense, layers=4, valid_share=0.7)
    encoded = encode_routes(batch, codec)
    V = int(batch.valid_N.sum())
    X = 2 * rows + 3
    rows_V = torch.from_numpy(np.sort(rng.choice(X, size=V, replace=False)))
    want = torch.full((X, 4, K), -1, dtype=dtype)
    decoded = decode_routes(encoded).values_NLK[batch.valid_N]
    moe = list(batch.meta.moe_slots)
    want[rows_V[:, None], torch.tensor(moe)[None, :]] = decoded[:, moe].to(dtype)
    for kernel in FAMILIES:
        out = torch.full((X, 4, K), -1, dtype=dtype)
        with kernels.use_kernel(kernel):
            assert decode_routes_into(encoded, out, rows_V) is out
        assert torch.equal(out, want), kernel


@pytest.mark.parametrize("order", ["increasing", "shuffled"])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_into_runs_of_rows(
    order: str, threads: int, torch_threads: Callable[[int], None]
) -> None:
    """Samples of hundreds of rows, the last row of each without a route, into a padded layout:
    the compiled decoder writes whole runs of rows in place and scatters the pairs where a run
    ends; rows in any order land where they are told."""
    torch_threads(threads)
    rng = np.random.default_rng(11)
    lengths = rng.integers(40, 400, 24)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    valid = np.ones(starts[-1], dtype=bool)
    valid[starts[1:] - 1] = False
    batch = set_batch(rng, 128, 8, int(starts[-1]), layers=4)
    batch = RouteBatch(batch.values_NLK, batch.offsets_B1, torch.from_numpy(valid), batch.meta)
    encoded = encode_routes(batch, "set")
    width = int(lengths.max()) + 5  # padded rows a sample
    rows_V = np.concatenate([b * width + 2 + np.arange(n - 1) for b, n in enumerate(lengths)])
    if order == "shuffled":
        rows_V = rng.permutation(rows_V)
    X = width * lengths.size
    want = torch.full((X, 4, 8), -1, dtype=torch.int16)
    sorted_NLK = batch.values_NLK.sort(dim=-1).values  # set decodes each row's ids sorted
    want[torch.from_numpy(rows_V)] = sorted_NLK[torch.from_numpy(valid)].to(torch.int16)
    for kernel in FAMILIES:
        out = torch.full((X, 4, 8), -1, dtype=torch.int16)
        with kernels.use_kernel(kernel):
            decode_routes_into(encoded, out, torch.from_numpy(rows_V))
        assert torch.equal(out, want), kernel


@pytest.mark.parametrize("codec", CODECS)
def test_decode_into_the_batch_layout_writes_only_valid_moe_slots(codec: str) -> None:
    batch = set_batch(np.random.default_rng(3), 128, 8, 300, dense=(2,), valid_share=0.5)
    encoded = encode_routes(batch, codec)
    for kernel in FAMILIES:
        out = torch.full((300, 3, 8), 999, dtype=torch.int16)
        with kernels.use_kernel(kernel):
            decode_routes_into(encoded, out)
        valid = batch.valid_N
        assert bool((out[~valid] == 999).all())
        assert bool((out[:, 1] == 999).all())  # the dense slot
        want = decode_routes(encoded).values_NLK.to(torch.int16)
        assert torch.equal(out[valid][:, [0, 2]], want[valid][:, [0, 2]]), kernel


def test_decode_into_refuses_a_layout_that_cannot_hold_the_ids() -> None:
    batch = set_batch(np.random.default_rng(4), 256, 8, 20, valid_share=0.5)
    encoded = encode_routes(batch, "set")
    V = int(batch.valid_N.sum())
    with pytest.raises(CodecError, match=r"\[rows, 3, 8\].*got \(20, 3, 4\)"):
        decode_routes_into(encoded, torch.zeros((20, 3, 4), dtype=torch.int16))
    with pytest.raises(CodecError, match=r"torch.int8 cannot hold expert ids below 256"):
        decode_routes_into(encoded, torch.zeros((20, 3, 8), dtype=torch.int8))
    with pytest.raises(CodecError, match=r"torch.float32 cannot hold"):
        decode_routes_into(encoded, torch.zeros((20, 3, 8)))
    with pytest.raises(CodecError, match=r"30 rows for a batch of 20 rows: pass rows_V"):
        decode_routes_into(encoded, torch.zeros((30, 3, 8), dtype=torch.int16))
    out = torch.zeros((30, 3, 8), dtype=torch.int16)
    with pytest.raises(CodecError, match=rf"tensor of {V} output rows .*shape \({V + 1},\)"):
        decode_routes_into(encoded, out, torch.arange(V + 1))
    with pytest.raises(
        CodecError, match=r"rows_V spans \[\d+, 30\]; the output has rows \[0, 30\)"
    ):
        decode_routes_into(encoded, out, torch.arange(31 - V, 31))
