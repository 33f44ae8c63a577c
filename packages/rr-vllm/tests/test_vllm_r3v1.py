"""The R3/v1 router-replay envelope decoded onto the all-layers axis, and every fault refused.

Shapes: T tokens, L layer slots (all_layers axis), M MoE slots, K top-k, E experts.
"""

from __future__ import annotations

import base64
import contextlib
import struct
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rr_core import RRError
from rr_fakes.emulations.engines import r3v1_payload, r3v1_raw, r3v1_wrap
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_r3v1,
    read_r3v1_header,
    validate_samples,
)
from rr_vllm._supported import R3V1_EXTRA
from vllm_testing import META, distinct_routes, make_meta

pytest.importorskip("zstandard")

EXAMPLES = 200
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
T, P = 9, 5


def moe_ids(meta, t: int = T, seed: int = 0) -> np.ndarray:
    """``[t, M, K]`` ids of the MoE columns, and the all-layers rows they come from."""
    return distinct_routes(meta, t, seed)[:, list(meta.moe_slots)]


def decode(data, meta=META, *, p=P, t=T, finish_reason=None, on_abort="mask"):
    options = DecodeOptions(meta=meta, on_abort=on_abort)
    return decode_r3v1(
        data, options, num_prompt_tokens=p, num_generated_tokens=t - p, finish_reason=finish_reason
    ).only()


@SETTINGS
@given(
    t=st.integers(1, 40),
    mask_seed=st.integers(0, 2**16),
    shape=st.sampled_from(["all", "suffix", "bitmap"]),
    num_experts=st.sampled_from([8, 256, 300]),
    frames=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_round_trip(t, mask_seed, shape, num_experts, frames, seed) -> None:
    meta = make_meta(num_experts=num_experts, dense=(2,), layers=4, top_k=3)
    routes_TLK = distinct_routes(meta, t, seed)
    rng = np.random.default_rng(mask_seed)
    if shape == "all":
        valid = np.ones(t, dtype=bool)
    elif shape == "suffix":
        valid = np.arange(t) >= rng.integers(0, t)
    else:
        valid = rng.random(t) < 0.6
        valid[rng.integers(0, t)] = True  # at least one replayed token
    data = r3v1_payload(
        routes_TLK[:, list(meta.moe_slots)],
        valid,
        selector=shape,
        frames=frames,
        num_experts=num_experts,
    )
    s = decode_r3v1(
        data,
        DecodeOptions(meta=meta),
        num_prompt_tokens=min(P, t),
        num_generated_tokens=t - min(P, t),
    ).only()
    assert s is not None
    assert s.valid_T.tolist() == valid.tolist()
    np.testing.assert_array_equal(s.routes_TLK[valid], routes_TLK[valid])
    assert not s.routes_TLK[~valid].any()
    raw = r3v1_raw(routes_TLK[:, list(meta.moe_slots)], valid, num_experts=num_experts)
    assert read_r3v1_header(raw).id_bytes == (1 if num_experts <= 256 else 2)
    batch = validate_samples([s], meta, allow_all_zero=True)  # tiny random samples
    np.testing.assert_array_equal(batch.values_NLK[valid].numpy(), routes_TLK[valid])


def test_trace_mapping_and_plain_text_decode_alike() -> None:
    ids = moe_ids(META)
    valid = np.arange(T) < T - 1  # the last sampled token has no route
    payload = r3v1_payload(ids, valid, selector="bitmap")
    a, b = decode(payload), decode(payload["data"].encode())
    assert a is not None
    assert b is not None
    np.testing.assert_array_equal(a.routes_TLK, b.routes_TLK)
    assert a.valid_T.tolist() == valid.tolist()
    assert a.num_prompt_tokens == P


def test_uint16_ids_decode_for_a_small_expert_count() -> None:
    ids, valid = moe_ids(META), np.ones(T, dtype=bool)
    s = decode(r3v1_wrap(r3v1_raw(ids, valid, id_bytes=2)))
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[:, list(META.moe_slots)], ids)


def fault(**header) -> str:
    return r3v1_wrap(r3v1_raw(moe_ids(META), np.ones(T, dtype=bool), **header))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (fault(magic=b"R3V2"), "not the magic"),
        (fault(version=2), "header version 2"),
        (fault(mode=3), "selector mode 3"),
        (fault(width=4), "routing dtype 4"),
        (fault(flags=3), "flags 0x03"),
        (fault(replayed=T - 1), "ALL selector with 8 replayed of 9"),
        (fault(start=1), "ALL replays every token from 0"),
        (fault(total=T + 1), "covers 10 tokens; the sample has 9"),
        (fault(matrix_len=T * 6 + 6), r"truncated \(see `rr explain G10`\)"),
        (fault(matrix_len=T * 6 - 6), "trailing bytes"),
        (r3v1_wrap(b"R3V1" + bytes(20)), "fewer than the 32-byte header"),
    ],
    ids=[
        "magic", "version", "selector", "dtype", "flags", "all-count", "all-start",
        "all-total", "truncated", "trailing", "short-header",
    ],
)  # fmt: skip
def test_header_faults(data: str, match: str) -> None:
    with pytest.raises(EngineOutputError, match=match):
        decode(data)


def test_uint16_without_little_endian_flag_is_refused() -> None:
    with pytest.raises(EngineOutputError, match="uint16 ids need it"):
        decode(fault(id_bytes=2, flags=0))


def test_truncated_matrix_is_an_error_not_a_partial_result() -> None:
    raw = r3v1_raw(moe_ids(META), np.ones(T, dtype=bool))
    for cut in (1, 6, 7, 30):
        with pytest.raises(EngineOutputError, match=r"truncated \(see `rr explain G10`\)"):
            decode(r3v1_wrap(raw[:-cut]))


def test_bitmap_faults() -> None:
    ids, valid = moe_ids(META), np.arange(T) % 2 == 0
    raw = bytearray(r3v1_raw(ids, valid, selector="bitmap"))
    sel = 32  # the bitmap's first byte
    extra = bytes(raw)
    extra_bit = bytearray(extra)
    extra_bit[sel + 1] |= 0x80  # token 15, past T = 9
    with pytest.raises(EngineOutputError, match="past the sample's 9 tokens"):
        decode(r3v1_wrap(bytes(extra_bit)))
    cleared = bytearray(extra)
    cleared[sel] &= 0xFE  # token 0 unmarked: 4 bits set, header says 5
    with pytest.raises(EngineOutputError, match="marks 4 tokens; the header says 5"):
        decode(r3v1_wrap(bytes(cleared)))


def test_bitmap_length_mismatch() -> None:
    ids, valid = moe_ids(META, 8), np.arange(8) % 2 == 0
    raw = r3v1_raw(ids, valid, selector="bitmap", total=9)  # 1 bitmap byte for 9 tokens
    with pytest.raises(EngineOutputError, match="BITMAP has 1 bytes; 9 tokens need 2"):
        decode(r3v1_wrap(raw), t=9)


def test_suffix_past_the_end_and_selector_bytes_on_suffix() -> None:
    ids, valid = moe_ids(META), np.arange(T) >= 4
    with pytest.raises(EngineOutputError, match="a suffix ends at token"):
        decode(r3v1_wrap(r3v1_raw(ids, valid, selector="suffix", start=5)))
    with pytest.raises(EngineOutputError, match="a suffix ends at token"):  # stops short
        decode(r3v1_wrap(r3v1_raw(ids, valid, selector="suffix", start=3)))
    raw = r3v1_raw(ids, valid, selector="suffix")
    head = struct.unpack_from("<4sBBBBIIIIQ", raw)
    bad = struct.pack("<4sBBBBIIIIQ", *head[:8], 1, head[9]) + b"\x00" + raw[32:]
    with pytest.raises(EngineOutputError, match="SUFFIX selector carries 1 selector bytes"):
        decode(r3v1_wrap(bad))


def test_matrix_size_must_match_the_meta() -> None:
    other = make_meta(dense=(1, 2))  # 2 MoE layers where the envelope has 3
    with pytest.raises(EngineOutputError, match=r"needs 4 per token \(2 MoE layers x top_k 2"):
        decode(fault(), meta=other)


def test_uint8_ids_for_many_experts_are_refused_as_wrapped() -> None:
    meta = make_meta(num_experts=300, dense=(1,))
    ids = moe_ids(meta) % 256
    with pytest.raises(EngineOutputError, match=r"uint8 but num_experts=300.*E4"):
        decode(r3v1_wrap(r3v1_raw(ids, np.ones(T, dtype=bool), id_bytes=1)), meta=meta)


def test_ids_out_of_range_name_token_and_layer() -> None:
    ids = moe_ids(META).copy()
    ids[4, 1, 0] = 200
    with pytest.raises(EngineOutputError, match=r"id 200 at replayed token 4, MoE layer 3"):
        decode(r3v1_wrap(r3v1_raw(ids, np.ones(T, dtype=bool))))


def test_zstd_and_base64_faults() -> None:
    good = base64.b64decode(fault())
    with pytest.raises(EngineOutputError, match="ends early"):
        decode(base64.b64encode(good[:-4]).decode())
    flipped = bytearray(good)
    flipped[0] ^= 0xFF  # the frame's magic number
    with pytest.raises(EngineOutputError, match="zstd frame is corrupt"):
        decode(base64.b64encode(bytes(flipped)).decode())
    with pytest.raises(EngineOutputError, match="not valid base64"):
        decode(fault()[:-3] + "!!!")
    with pytest.raises(EngineOutputError, match="not valid base64"):
        decode("é" + fault())
    with pytest.raises(EngineOutputError, match="empty"):
        decode("")


def test_payload_shapes_and_manifest_are_checked() -> None:
    with pytest.raises(EngineOutputError, match="base64 text"):
        decode(12)  # type: ignore[arg-type]
    with pytest.raises(EngineOutputError, match="PayloadVersion='r3/v2'"):
        decode({"manifest": {"PayloadVersion": "r3/v2", "Compression": "zstd"}, "data": ""})
    with pytest.raises(EngineOutputError, match="no 'data'"):
        decode({"manifest": {"PayloadVersion": "r3/v1"}})


def test_no_replayed_token_on_a_finished_request_is_d3_and_abort_masks() -> None:
    empty = r3v1_wrap(r3v1_raw(moe_ids(META), np.zeros(T, dtype=bool), selector="bitmap"))
    with pytest.raises(EngineOutputError, match=r"replays 0 of 9 tokens.*D3"):
        decode(empty, finish_reason="stop")
    masked = decode(empty, finish_reason="abort")
    assert masked is not None
    assert masked.aborted
    assert not masked.valid_T.any()
    assert decode(empty, finish_reason="abort", on_abort="drop") is None


@pytest.mark.parametrize(("p", "t"), [(10, 10), (5, 8), (0, 10)])
def test_token_count_must_match_the_envelope(p: int, t: int) -> None:
    with pytest.raises(EngineOutputError, match=f"covers 9 tokens; the sample has {t}"):
        decode(fault(), p=p, t=t)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_arbitrary_bytes_raise_rr_errors_only(blob: bytes, as_envelope: bool) -> None:
    data = r3v1_wrap(b"R3V1" + blob if as_envelope else blob)
    with contextlib.suppress(RRError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(
    shape=st.sampled_from(["all", "suffix", "bitmap"]),
    offset=st.integers(0, 31),
    value=st.integers(0, 255),
)
def test_a_changed_header_byte_decodes_the_same_routes_or_raises(shape, offset, value) -> None:
    ids, valid = moe_ids(META), np.arange(T) >= 2
    raw = bytearray(r3v1_raw(ids, np.ones(T, bool) if shape == "all" else valid, selector=shape))
    original = decode(r3v1_wrap(bytes(raw)))
    raw[offset] = value
    try:
        s = decode(r3v1_wrap(bytes(raw)))
    except EngineOutputError:
        return
    assert s is not None
    assert original is not None
    np.testing.assert_array_equal(s.routes_TLK, original.routes_TLK)
    assert s.valid_T.tolist() == original.valid_T.tolist()


def test_missing_zstandard_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    data = fault()
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(EngineOutputError, match=r"pip install 'rr-vllm\[r3v1\]'"):
        decode(data)


def test_the_install_hint_names_a_real_extra() -> None:
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("zstandard") for d in extras[R3V1_EXTRA])


@pytest.mark.parametrize("declares_size", [True, False])
@pytest.mark.parametrize("second_frame", [False, True])
def test_a_payload_that_decompresses_past_what_the_sample_can_hold_is_refused_early(
    declares_size: bool, second_frame: bool
) -> None:
    """A few KB of zstd that inflate to 256 MB (a bomb, or another sample's envelope) are
    refused after reading at most the bound (header + bitmap + uint16 ids of T tokens)."""
    import tracemalloc

    import zstandard

    good = base64.b64decode(fault())
    bomb = zstandard.ZstdCompressor(write_content_size=declares_size).compress(b"\0" * (256 << 20))
    blob = good + bomb if second_frame else bomb
    assert len(blob) < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(EngineOutputError, match=r"decompresses to more than \d+ bytes"):
            decode(base64.b64encode(blob).decode())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # never the 256 MB
