"""Codecs: exact round trips over expert counts and top-k, sizes at the information floor,
pickling, and the errors on bad ids and corrupt payloads."""

from __future__ import annotations

import dataclasses
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import RouteBatch, RouteMeta
from rr_core.codecs.encoding import (
    CODECS,
    bytes_per_token,
    decode_routes,
    encode_routes,
    payload_bytes,
)
from rr_core.errors import CodecError

from rr_core_testing import EXPERT_COUNTS, as_uint8, random_batch


@st.composite
def batches(draw: st.DrawFn) -> RouteBatch:
    E = draw(st.sampled_from(EXPERT_COUNTS))
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


def test_set_codec_with_a_single_set_costs_nothing() -> None:
    """E = K = 8 on uint8 ids: the fast shape, but zero-bit ranks take the general path."""
    batch = random_batch(np.random.default_rng(8), 8, 8, lengths=[3, 2])
    batch = as_uint8(batch)
    encoded = encode_routes(batch, "set")
    assert encoded.payload.numel() == 0
    assert torch.equal(decode_routes(encoded).values_NLK, batch.values_NLK.sort(dim=2).values)
