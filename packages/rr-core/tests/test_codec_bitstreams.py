"""Codec bit streams: fixed-width fields, byte groups and words round trip exactly and agree
with each other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
