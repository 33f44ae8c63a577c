"""Codecs: exact round trips over expert counts and top-k, sizes at the information floor."""

from __future__ import annotations

import dataclasses
import math
import pickle
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import RouteBatch, RouteMeta
from rr_core.codecs.bitpack import (
    BLOCK,
    pack_bits,
    pack_fields,
    pack_ids,
    unpack_bits,
    unpack_fields,
    unpack_ids,
)
from rr_core.codecs.bitpack_bytes import BLOCK as BYTE_BLOCK
from rr_core.codecs.bitpack_bytes import (
    _decode_torch,
    _encode_torch,
    pack_byte_ids,
    unpack_byte_ids,
)
from rr_core.codecs.encoding import (
    CODECS,
    EncodedRoutes,
    bytes_per_token,
    decode_routes,
    encode_routes,
    payload_bytes,
)
from rr_core.codecs.sets import rank_sets, set_width, unrank_sets
from rr_core.errors import CodecError

EXPERTS = (2, 8, 60, 64, 128, 160, 256, 257, 384, 512)


def random_batch(
    rng: np.random.Generator,
    E: int,
    K: int,
    *,
    lengths: list[int],
    layers: int = 3,
    dense: tuple[int, ...] = (),
    valid_share: float = 0.7,
) -> RouteBatch:
    """Distinct ids per (row, MoE layer); zeros on dense slots and invalid rows."""
    N, L = sum(lengths), layers
    moe = tuple(n for n in range(1, L + 1) if n not in dense)
    ids = rng.random((N * len(moe), E)).argsort(axis=1)[:, :K].reshape(N, len(moe), K)
    values = np.zeros((N, L, K), dtype=np.int64)
    values[:, [n - 1 for n in moe]] = ids
    valid = rng.random(N) < valid_share
    values[~valid] = 0
    axis = "all_layers" if dense else "moe_layers"
    meta = RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis=axis,
        layer_numbers=tuple(range(1, L + 1)),
        moe_layer_numbers=moe if dense else None,
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return RouteBatch(
        torch.from_numpy(values), offsets, torch.from_numpy(valid), meta, allow_all_zero=True
    )


def as_uint8(batch: RouteBatch) -> RouteBatch:
    """The same batch with uint8 ids: the set codec's fast path takes those (E <= 256, K = 8)."""
    v = batch.values_NLK.to(torch.uint8)
    return RouteBatch(v, batch.offsets_B1, batch.valid_N, batch.meta, allow_all_zero=True)


@st.composite
def batches(draw: st.DrawFn) -> RouteBatch:
    E = draw(st.sampled_from(EXPERTS))
    K = draw(st.integers(1, min(E, 22)))
    lengths = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4))
    dense = draw(st.sampled_from([(), (1,), (2, 4)]))
    share = draw(st.sampled_from([0.0, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    return random_batch(rng, E, K, lengths=lengths, layers=4, dense=dense, valid_share=share)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), codec=st.sampled_from(CODECS))
def test_every_codec_round_trips(batch: RouteBatch, codec: str) -> None:
    enc = encode_routes(batch, codec)
    out = decode_routes(enc)
    expected = batch.values_NLK.sort(dim=-1).values if codec == "set" else batch.values_NLK
    assert out.values_NLK.dtype == batch.values_NLK.dtype
    assert torch.equal(out.values_NLK, expected)
    assert torch.equal(out.valid_N, batch.valid_N)
    assert torch.equal(out.offsets_B1, batch.offsets_B1)
    assert out.meta == batch.meta
    V = int(batch.valid_N.sum())
    assert enc.payload.numel() == payload_bytes(batch.meta, codec, V)
    assert enc.payload.numel() == math.ceil(V * bytes_per_token(batch.meta, codec) - 1e-9)
    assert enc.valid_bits.numel() == -(-batch.num_tokens // 8)


def test_qwen3_30b_sizes_reach_the_floor() -> None:
    meta = RouteMeta(
        num_experts=128, top_k=8, layer_axis="moe_layers", layer_numbers=tuple(range(1, 49))
    )
    sizes = {c: bytes_per_token(meta, c) for c in CODECS}
    assert sizes == {"raw": 384, "packed": 336, "set": 246}
    floor = math.log2(math.comb(128, 8)) * 48 / 8
    assert sizes["set"] <= floor * 1.02


def test_dense_slots_and_invalid_rows_cost_nothing() -> None:
    rng = np.random.default_rng(0)
    batch = random_batch(rng, 64, 4, lengths=[5, 7], layers=4, dense=(1, 3))
    full = random_batch(rng, 64, 4, lengths=[5, 7], layers=2, valid_share=1.0)
    V = int(batch.valid_N.sum())
    assert encode_routes(batch, "packed").payload.numel() == math.ceil(V * 2 * 4 * 6 / 8)
    assert encode_routes(full, "packed").payload.numel() == 12 * 2 * 4 * 6 // 8


@pytest.mark.parametrize("codec", CODECS)
def test_pickles_small_and_round_trips(codec: str) -> None:
    """A batch pickled alone (one agent-loop sample, one Ray message) carries its arrays with
    little besides: its tensors go as numpy arrays, not torch's per-tensor archives."""
    batch = random_batch(np.random.default_rng(2), 128, 8, lengths=[3, 5], layers=4)
    enc = encode_routes(batch, codec)
    data = pickle.dumps(enc)
    back = pickle.loads(data)
    assert torch.equal(decode_routes(back).values_NLK, decode_routes(enc).values_NLK)
    assert back.codec == enc.codec
    assert back.meta == enc.meta
    assert back.num_rows == enc.num_rows
    as_torch_pickles = len(pickle.dumps([enc.offsets_B1, enc.valid_bits, enc.payload]))
    assert len(data) < as_torch_pickles
    buffers: list[pickle.PickleBuffer] = []  # out of band, read-only on arrival (as Ray does)
    framed = pickle.dumps(enc, protocol=5, buffer_callback=buffers.append)
    assert buffers
    sealed = [memoryview(b).toreadonly() for b in buffers]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a tensor over a read-only array
        arrived = pickle.loads(framed, buffers=sealed)
    assert torch.equal(decode_routes(arrived).values_NLK, decode_routes(enc).values_NLK)


def test_decode_targets_a_device() -> None:
    batch = random_batch(np.random.default_rng(1), 160, 6, lengths=[4, 4])
    out = decode_routes(encode_routes(batch, "set"), device="cpu")
    assert out.values_NLK.device == torch.device("cpu")
    assert torch.equal(out.values_NLK, batch.values_NLK.sort(dim=-1).values)


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


@pytest.mark.parametrize("width", [1, 3, 5, 6, 7, 9, 13, 15, 31, 32, 33, 41, 56, 62, 64, 100, 130])
@pytest.mark.parametrize("count", [0, 1, 77, 3 * BLOCK + 5])
def test_bit_streams_round_trip(width: int, count: int) -> None:
    gen = torch.Generator().manual_seed(width)
    nl = -(-width // 32)
    limbs = torch.randint(0, 2**32, (count, nl), generator=gen)
    limbs[:, -1] &= (1 << (width - 32 * (nl - 1))) - 1
    stream = pack_bits(limbs, width)
    assert stream.numel() == -(-count * width // 8)
    assert torch.equal(unpack_bits(stream, count, width), limbs)
    if width <= 63:  # the fast paths write the same stream
        fields = limbs[:, 0] | (limbs[:, 1] << 32) if nl == 2 else limbs[:, 0]
        assert torch.equal(pack_fields(fields, width), stream)
        assert torch.equal(unpack_fields(stream, count, width), fields)
    for dtype in (torch.uint8, torch.int16):
        if width < 8 * dtype.itemsize:
            ids = limbs[:, 0].to(dtype)
            assert torch.equal(pack_ids(ids, width), stream)
            assert torch.equal(unpack_ids(stream, count, width, dtype), ids)
            unaligned = torch.cat([stream.new_zeros(1), stream])[1:]  # not a whole-word view
            assert torch.equal(unpack_ids(unaligned, count, width, dtype), ids)


def test_set_unranking_is_exact_for_every_small_set() -> None:
    import itertools

    for E in range(1, 12):
        for K in range(1, E + 1):
            ids = torch.tensor(list(itertools.combinations(range(E), K)))
            limbs = rank_sets(ids, E)
            assert torch.equal(rank_sets(ids, E, single_out=True), limbs[:, 0])
            assert torch.equal(unrank_sets(limbs, E, K), ids)


def test_out_of_range_and_repeated_ids_raise() -> None:
    meta = RouteMeta(num_experts=60, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))
    wild = RouteBatch(torch.tensor([[[3, 61]]]), [0, 1], None, meta, validate=False)
    with pytest.raises(CodecError, match=r"\[3, 61\]"):
        encode_routes(wild, "packed")
    twice = RouteBatch(torch.tensor([[[5, 5]]]), [0, 1], None, meta, validate=False)
    with pytest.raises(CodecError, match="distinct"):
        encode_routes(twice, "set")
    with pytest.raises(CodecError, match="unknown codec"):
        encode_routes(twice, "zip")
    for name in (np.array(["raw", "set"]), ["raw"], None, b"raw"):  # look-alikes of a name
        with pytest.raises(CodecError, match="unknown codec"):
            encode_routes(twice, name)  # type: ignore[arg-type]


def test_corrupt_payloads_raise() -> None:
    meta = RouteMeta(num_experts=60, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))
    batch = RouteBatch(torch.tensor([[[3, 7]]]), [0, 1], None, meta)
    for codec in ("packed", "set"):
        enc = encode_routes(batch, codec)
        assert (enc.meta, enc.num_rows) == (meta, 1)
        with pytest.raises(CodecError, match="corrupt"):
            decode_routes(dataclasses.replace(enc, payload=torch.full_like(enc.payload, 255)))
        with pytest.raises(CodecError, match="bytes"):
            decode_routes(dataclasses.replace(enc, payload=enc.payload[:-1]))


@pytest.mark.parametrize("width", range(1, 8))
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 77, 8 * BYTE_BLOCK + 8, 8 * BYTE_BLOCK + 13])
def test_byte_group_streams_round_trip(width: int, count: int) -> None:
    gen = torch.Generator().manual_seed(width + count)
    ids = torch.randint(0, 1 << width, (count,), generator=gen, dtype=torch.uint8)
    stream = pack_byte_ids(ids, width)
    assert stream.numel() == -(-count * width // 8)
    assert torch.equal(unpack_byte_ids(stream, count, width), ids)
    unaligned = torch.cat([stream.new_zeros(1), stream])[1:]
    assert torch.equal(unpack_byte_ids(unaligned, count, width), ids)
    G = count // 8
    if G:  # the CPU words and the torch reference write the same groups
        groups = _encode_torch(ids[: 8 * G].view(G, 8), width)
        assert torch.equal(stream[: G * width], groups.reshape(-1))
        assert torch.equal(_decode_torch(groups, width), ids[: 8 * G].view(G, 8))
    if count >= 16:  # whole groups concatenate
        cut = 8 * (G // 2)
        parts = torch.cat([pack_byte_ids(ids[:cut], width), pack_byte_ids(ids[cut:], width)])
        assert torch.equal(parts, stream)


def test_byte_group_layout() -> None:
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0b1010101], dtype=torch.uint8)
    expected = [1 | 128, 2, 3 | 128, 4, 5 | 128, 6, 7 | 128]  # bit i of id 7 tops byte i
    assert pack_byte_ids(ids, 7).tolist() == expected


def test_packed_cpu_encoding_falls_back_to_the_reference_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If numpy ever stops writing overlapping outputs in order, the self-check picks torch."""
    from rr_core.codecs import bitpack_bytes as _bitpack_bytes

    ids = torch.randint(0, 128, (8 * 1000 + 5,), dtype=torch.uint8)
    fast = _bitpack_bytes.pack_byte_ids(ids, 7)
    monkeypatch.setattr(_bitpack_bytes, "_numpy_path_exact", lambda width: False)
    reference = _bitpack_bytes.pack_byte_ids(ids, 7)
    assert torch.equal(fast, reference)
    assert torch.equal(_bitpack_bytes.unpack_byte_ids(reference, ids.numel(), 7), ids)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("E", [8, 60, 128, 160, 256])
def test_fast_set_path_matches_the_general_one(
    E: int, threads: int, torch_threads: Callable[[int], None]
) -> None:
    from rr_core.codecs.sets import unrank_single
    from rr_core.codecs.sets_fast import BLOCK as SET_BLOCK
    from rr_core.codecs.sets_fast import fast_shape, rank_fast, unrank_fast

    assert fast_shape(E, 8, torch.uint8, torch.device("cpu"))
    rng = np.random.default_rng(E)
    R = 2 * SET_BLOCK + 5  # several blocks and a partial one
    ids = np.argsort(rng.random((R, E)), axis=1)[:, :8].astype(np.uint8)
    ids[0], ids[1] = np.arange(E - 8, E), np.arange(8)  # the largest and the smallest set
    ids_RK = torch.from_numpy(ids)
    ranks = rank_sets(ids_RK, E, single_out=True)
    torch_threads(threads)  # two threads: the second decodes the blocks from SET_BLOCK on
    assert torch.equal(rank_fast(ids_RK, E), ranks)
    out = unrank_fast(ranks, E)
    assert torch.equal(out, ids_RK.sort(dim=1).values)
    assert torch.equal(out.to(torch.int64), unrank_single(ranks, E, 8))
    for row, (i, j) in ((SET_BLOCK + 3, (3, 6)), (2 * SET_BLOCK + 1, (0, 1))):
        twice = ids_RK.clone()
        twice[row, i] = twice[row, j]
        assert rank_fast(twice, E) is None
    corrupt = ranks.clone()
    corrupt[2 * SET_BLOCK + 2] = math.comb(E, 8)  # no such set, in the last range
    assert unrank_fast(corrupt, E) is None


@pytest.mark.parametrize("E", [128, 256])
def test_threaded_set_encoding_writes_the_reference_stream(
    E: int, torch_threads: Callable[[int], None]
) -> None:
    """Two threads pack their ranges in any order; each range's last block carries the low
    bits of the next range's first rank, so the stream is the serial one bit for bit."""
    from rr_core.codecs.bitpack_words import WordPacker
    from rr_core.codecs.sets_fast import BLOCK as SET_BLOCK
    from rr_core.codecs.sets_fast import rank_fast

    rng = np.random.default_rng(E)
    R = 3 * SET_BLOCK + 13
    ids_RK = torch.from_numpy(np.argsort(rng.random((R, E)), axis=1)[:, :8].astype(np.uint8))
    width = set_width(E, 8)
    reference = pack_fields(rank_sets(ids_RK, E, single_out=True), width)
    for threads in (1, 2, 3):
        torch_threads(threads)
        packer = WordPacker(R, width)
        assert rank_fast(ids_RK, E, packer.put) is not None
        assert torch.equal(packer.stream(), reference), threads
    ranks = rank_sets(ids_RK, E, single_out=True).numpy().view(np.uint64)
    packer = WordPacker(R, width)
    for first in reversed(range(0, R, 1000)):  # the worst order, deterministically
        nxt = int(ranks[first + 1000]) if first + 1000 < R else 0
        packer.put(first, ranks[first : first + 1000], nxt)
    assert torch.equal(packer.stream(), reference)


def test_set_codec_falls_back_when_casts_drop_low_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """If numpy's narrowing casts ever stop keeping the low bits, the general path decodes."""
    from rr_core.codecs import sets_fast as _codec_set_fast

    assert _codec_set_fast._low_bytes_cast()
    batch = random_batch(np.random.default_rng(7), 128, 8, lengths=[40, 30], layers=5)
    batch = as_uint8(batch)
    fast = encode_routes(batch, "set")
    monkeypatch.setattr(_codec_set_fast, "_low_bytes_cast", lambda: False)
    assert not _codec_set_fast.fast_shape(128, 8, torch.uint8, torch.device("cpu"))
    general = encode_routes(batch, "set")
    assert torch.equal(fast.payload, general.payload)
    slow_ids = decode_routes(general).values_NLK
    monkeypatch.undo()
    fast_ids = decode_routes(fast).values_NLK
    assert torch.equal(fast_ids, slow_ids)
    assert torch.equal(fast_ids, batch.values_NLK.sort(dim=2).values)


@pytest.mark.parametrize("width", [32, 33, 40, 41, 44, 49, 55, 56])
def test_word_streams_match_the_field_streams(width: int) -> None:
    from rr_core.codecs.bitpack_words import BLOCK as WORD_BLOCK
    from rr_core.codecs.bitpack_words import covers, pack_words, unpack_words

    assert covers(width, torch.device("cpu"))
    rng = np.random.default_rng(width)
    for count in (0, 1, 7, 8, 9, 8 * WORD_BLOCK, 16 * WORD_BLOCK + 13):
        fields = torch.from_numpy(rng.integers(0, 1 << width, count, dtype=np.int64))
        fields[: min(count, 3)] = (1 << width) - 1  # every bit set: spills reach the neighbours
        stream = pack_fields(fields, width)
        assert torch.equal(pack_words(fields, width), stream)
        assert torch.equal(unpack_words(stream, count, width), fields)
        framed = torch.cat([torch.tensor([7], dtype=torch.uint8), stream])[1:]  # offset storage
        assert torch.equal(unpack_words(framed, count, width), fields)
    with pytest.raises(ValueError, match="bytes"):
        unpack_words(torch.zeros(9, dtype=torch.uint8), 1, width)


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


def test_set_codec_with_a_single_set_costs_nothing() -> None:
    """E = K = 8 on uint8 ids: the fast shape, but zero-bit ranks take the general path."""
    batch = random_batch(np.random.default_rng(8), 8, 8, lengths=[3, 2])
    batch = as_uint8(batch)
    encoded = encode_routes(batch, "set")
    assert encoded.payload.numel() == 0
    assert torch.equal(decode_routes(encoded).values_NLK, batch.values_NLK.sort(dim=2).values)


def test_fast_set_decoding_reports_a_corrupt_rank_in_any_block() -> None:
    from rr_core.codecs.sets_fast import BLOCK as SET_BLOCK

    E, N = 128, 2 * SET_BLOCK + 9
    meta = RouteMeta(num_experts=E, top_k=8, layer_axis="moe_layers", layer_numbers=(1,))
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((N, E)), axis=1)[:, :8].astype(np.uint8)
    batch = RouteBatch(torch.from_numpy(ids[:, None, :]), [0, N], None, meta)
    enc = encode_routes(batch, "set")
    ranks = rank_sets(torch.from_numpy(ids), E, single_out=True)
    width = set_width(E, 8)
    assert torch.equal(enc.payload, pack_fields(ranks, width))
    for row in (0, SET_BLOCK + 3, N - 1):
        bad_ranks = ranks.clone()
        bad_ranks[row] = math.comb(E, 8)
        bad = EncodedRoutes(
            codec="set",
            meta=meta,
            num_rows=N,
            offsets_B1=enc.offsets_B1,
            valid_bits=enc.valid_bits,
            payload=pack_fields(bad_ranks, width),
        )
        with pytest.raises(CodecError, match="corrupt"):
            decode_routes(bad)


@pytest.mark.parametrize("E", [16, 60, 128, 185, 186, 256])
def test_fast_set_payloads_match_the_general_path(E: int) -> None:
    """uint8 ids take the fast path (ranks packed block by block); int64 ids the general one."""
    from rr_core.codecs.sets_fast import BLOCK as SET_BLOCK

    rng = np.random.default_rng(E)
    general = random_batch(rng, E, 8, lengths=[SET_BLOCK // 3 + 5, 7], layers=4, valid_share=0.9)
    fast = as_uint8(general)
    enc = encode_routes(fast, "set")
    assert torch.equal(enc.payload, encode_routes(general, "set").payload)
    assert torch.equal(decode_routes(enc).values_NLK, fast.values_NLK.sort(dim=2).values)


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
