"""A payload is bytes: decode_routes and decode_routes_into refuse a payload widened
element by element to another dtype (which decoded to other ids for E=8 and E=128 and raised
torch errors for E=300), and accept a byte view of a buffer whose byte length matches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rr_core import CodecError, RouteBatch
from rr_core.codecs.encoding import CODECS, decode_routes, decode_routes_into, encode_routes

from rr_core_testing import route_meta


def batch_of(num_experts: int, top_k: int = 2, rows: int = 16) -> RouteBatch:
    meta = route_meta(num_experts, top_k, layers=(1, 2, 3), moe=(1, 3))
    gen = torch.Generator().manual_seed(num_experts)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(rows * 3)])
    values = ids.reshape(rows, 3, top_k)
    values[:, 1] = 0  # the dense slot holds zeros
    dtype = torch.uint8 if num_experts <= 256 else torch.int16
    offsets = torch.tensor([0, rows], dtype=torch.int64)
    return RouteBatch(values.to(dtype), offsets, torch.ones(rows, dtype=torch.bool), meta)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("num_experts", [8, 128, 300])
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64, torch.float32])
def test_a_widened_payload_is_refused_by_dtype(
    codec: str, num_experts: int, dtype: torch.dtype
) -> None:
    encoded = encode_routes(batch_of(num_experts), codec)
    widened = dataclasses.replace(encoded, payload=encoded.payload.to(dtype))
    with pytest.raises(CodecError, match=rf"payload must be uint8.*{dtype}"):
        decode_routes(widened)
    out = torch.zeros((16, 3, 2), dtype=torch.int64)
    with pytest.raises(CodecError, match=rf"payload must be uint8.*{dtype}"):
        decode_routes_into(widened, out)


@pytest.mark.parametrize("codec", CODECS)
def test_a_byte_view_of_the_same_bytes_decodes_exactly(codec: str) -> None:
    batch = batch_of(128, top_k=4, rows=32)
    encoded = encode_routes(batch, codec)
    size = encoded.payload.numel()
    padded = torch.zeros(-(-size // 8) * 8, dtype=torch.uint8)
    padded[:size] = encoded.payload
    if size % 8 == 0:  # the same bytes held as int64 words: a byte view of the buffer
        words = dataclasses.replace(encoded, payload=padded.view(torch.int64))
        assert torch.equal(decode_routes(words).values_NLK, decode_routes(encoded).values_NLK)
    as_2d = dataclasses.replace(encoded, payload=encoded.payload.reshape(1, -1))
    assert torch.equal(decode_routes(as_2d).values_NLK, decode_routes(encoded).values_NLK)


def test_a_payload_that_is_not_a_tensor_is_refused_by_type() -> None:
    encoded = encode_routes(batch_of(8), "packed")
    raw = bytes(encoded.payload.numpy())
    with pytest.raises(CodecError, match=r"payload must be a uint8 torch\.Tensor; got bytes"):
        decode_routes(dataclasses.replace(encoded, payload=raw))  # type: ignore[arg-type]
