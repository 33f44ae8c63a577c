"""The codecs' fast paths (numpy byte packing, the uint8 set path, threaded set encoding) write
exactly what the general path writes, fall back where they cannot, and report corrupt ranks."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from rr_core import RouteBatch, RouteMeta
from rr_core.codecs.bitpack import (
    pack_fields,
)
from rr_core.codecs.encoding import (
    EncodedRoutes,
    decode_routes,
    encode_routes,
)
from rr_core.codecs.sets import rank_sets, set_width
from rr_core.errors import CodecError

from rr_core_testing import as_uint8, random_batch


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
