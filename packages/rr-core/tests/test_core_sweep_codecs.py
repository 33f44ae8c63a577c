"""Property sweep of the codecs (encode, decode, decode into, sizes): a checked result or an
RRError.

The invariant every sweep checks, and the list of swept names: test_core_sweep.py; the generated
input: rr_core_testing.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

import rr_core
from rr_core import CODECS, RouteBatch, RouteMeta
from rr_fakes.pytest_support import settles

from rr_core_testing import ANY_DTYPES, ANYTHING, JUNK, SWEEP, metas, tensors, valid_batches


@SWEEP
@given(batch=valid_batches(), codec=st.one_of(st.sampled_from([*CODECS, "zip"]), JUNK))
def test_codec_round_trip(batch: RouteBatch, codec: Any) -> None:
    ok, enc = settles(rr_core.encode_routes, batch, codec)
    if not ok:
        return
    dec = rr_core.decode_routes(enc)
    assert torch.equal(dec.valid_N, batch.valid_N)
    mine = batch.values_NLK[batch.valid_N].to(torch.int64)
    theirs = dec.values_NLK[dec.valid_N].to(torch.int64)
    if codec == "set":
        mine, theirs = mine.sort(-1).values, theirs.sort(-1).values
    assert torch.equal(mine, theirs)
    assert enc.nbytes >= rr_core.payload_bytes(batch.meta, codec, int(batch.valid_N.sum()))


@SWEEP
@given(
    batch=valid_batches(),
    codec=st.sampled_from(list(CODECS)),
    dtype=st.sampled_from(ANY_DTYPES),
    extra=st.integers(-1, 2),
    rows=st.one_of(st.none(), tensors(max_dims=2, high=12), JUNK),
)
def test_decode_into(batch: RouteBatch, codec: str, dtype: Any, extra: int, rows: Any) -> None:
    enc = rr_core.encode_routes(batch, codec)
    N, L, K = batch.values_NLK.shape
    out = torch.full((max(N + extra, 0), L, K), 7, dtype=dtype)
    ok, got = settles(rr_core.decode_routes_into, enc, out, rows_V=rows)
    if ok and rows is None:
        assert got is out
        v = batch.valid_N
        mine, theirs = batch.values_NLK[v].to(torch.int64), got[v].to(torch.int64)
        moe = list(batch.meta.moe_slots)
        mine, theirs = mine[:, moe], theirs[:, moe]
        if codec == "set":
            mine, theirs = mine.sort(-1).values, theirs.sort(-1).values
        assert torch.equal(mine, theirs)
    settles(rr_core.decode_routes_into, enc, rows if rows is not None else 3)


@SWEEP
@given(meta=metas(), codec=st.one_of(st.sampled_from([*CODECS, "zip"]), JUNK), n=ANYTHING)
def test_codec_sizes(meta: RouteMeta, codec: Any, n: Any) -> None:
    ok, size = settles(rr_core.bytes_per_token, meta, codec)
    if ok:
        assert size >= 0  # 0 bits per id for a single expert under packed
    ok, size = settles(rr_core.payload_bytes, meta, codec, n)
    if ok:
        assert size >= 0
    settles(rr_core.encode_routes, n)
    settles(rr_core.decode_routes, n)
