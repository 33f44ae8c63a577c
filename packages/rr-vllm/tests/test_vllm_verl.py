"""Compact routes for verl, torch alone: every codec round-trips into verl's trainer layouts and
bad routes raise rr errors (verl's own conversion of the same answers is test_vllm_verl_versus')."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
import torch

from rr_core import (
    CODECS,
    AlignmentError,
    CodecError,
    RouteBatch,
    RouteMeta,
    RouteValidationError,
    decode_routes,
)
from rr_core import bytes_per_token as codec_bytes_per_token
from rr_core.codecs import scatter
from rr_fakes.emulations.engines import (
    Faults,
    VllmEra,
    vllm_request_output,
)
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    SampleRoutes,
    VerlRoutes,
    assemble_multi_turn,
    concat_verl_routes,
    decode_routes_array,
    decode_vllm_output,
    pack_batch_for_verl,
    pack_for_verl,
    to_verl_nested,
    to_verl_padded,
    unreplayable_rows,
)
from verl_testing import (
    DENSE_FIRST,
    FORMATS,
    LAYOUTS,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    SHAPES,
    as_codec,
    expected_nested_values,
    expected_padded,
    rollout,
)
from vllm_testing import distinct_routes, make_meta

# -- (a) torch only ----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_into_both_layouts(fmt: str, layout: str, codec: str) -> None:
    meta = LAYOUTS[layout]
    r = rollout(fmt, meta)
    routes = pack_for_verl(r.samples, meta, codec=codec)
    assert routes.num_samples == len(SHAPES)
    assert routes.codec == codec
    assert routes.num_prompt_tokens == tuple(p for p, _ in SHAPES)
    assert routes.lengths == tuple(p + g for p, g in SHAPES)
    nested = to_verl_nested(routes)
    assert nested.is_nested
    assert nested.layout == torch.jagged
    assert nested.dtype == torch.int16
    assert nested.offsets().tolist() == [0, *itertools.accumulate(p + g for p, g in SHAPES)]
    assert torch.equal(nested.values(), as_codec(expected_nested_values(r), codec))
    padded = to_verl_padded(routes, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    assert padded.dtype == torch.int16
    assert torch.equal(padded, as_codec(expected_padded(r, PROMPT_LENGTH, RESPONSE_LENGTH), codec))


@pytest.mark.parametrize("codec", CODECS)
def test_batch_path_equals_sample_path(codec: str) -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    batch = decode_vllm_output(r.raw, DecodeOptions(meta=DENSE_FIRST)).to_batch()
    prompts = [len(p) for p in r.prompts]
    for validate in (True, False):
        got = pack_batch_for_verl(batch, prompts, codec=codec, validate=validate)
        want = pack_for_verl(r.samples, DENSE_FIRST, codec=codec)
        assert torch.equal(got.encoded.payload, want.encoded.payload)
        assert got.num_prompt_tokens == want.num_prompt_tokens


def test_bytes_per_token_on_qwen3_30b_a3b_shape() -> None:
    meta = make_meta(num_experts=128, layers=48, top_k=8)
    r = rollout("vllm_uint8", meta, shapes=[(40, 25), (17, 48)])
    figures = {c: pack_for_verl(r.samples, meta, codec=c) for c in CODECS}
    assert {c: codec_bytes_per_token(meta, c) for c in CODECS} == {
        "raw": 384.0,
        "packed": 336.0,
        "set": 246.0,
    }
    for codec, routes in figures.items():
        assert routes.verl_bytes_per_token == 768  # 48 layers x top-8 x int16
        tokens, valid = routes.num_tokens, routes.num_tokens - routes.num_samples  # T-1 rows
        payload = codec_bytes_per_token(meta, codec) * valid
        assert routes.bytes_per_token == pytest.approx((payload + -(-tokens // 8)) / tokens, 1e-3)
        assert routes.nbytes == routes.encoded.nbytes + 8 * routes.num_samples


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda a: a.__setitem__((2, 3, 1), 16), r"layer 4 .*outside \[0, 16\)"),
        (lambda a: a.__setitem__((2, 3, 1), a[2, 3, 0]), r"repeat an id; .*top_k=4 distinct"),
        (lambda a: a.__setitem__((2, 0, 0), 3), r"layer 1 \(slot 0, dense\).*must hold zeros"),
        (lambda a: a.__setitem__((slice(None), slice(1, None)), 0), r"all zero.*\(E1\)"),
        (lambda a: a.__setitem__((2, 3, 1), -1), r"do not fit torch.uint8"),
    ],
    ids=["out_of_range", "duplicate", "dense_slot", "zero_filled", "negative"],
)
def test_bad_ids_raise(mutate: Callable[[np.ndarray], None], match: str) -> None:
    ids = distinct_routes(DENSE_FIRST, 8, seed=1)
    mutate(ids)
    sample = decode_routes_array(
        ids, DecodeOptions(meta=DENSE_FIRST), num_prompt_tokens=4, num_generated_tokens=5
    ).only()
    with pytest.raises(RouteValidationError, match=match):
        pack_for_verl([sample], DENSE_FIRST)
    with pytest.raises(RouteValidationError, match=match):  # the same rows, unchecked
        pack_batch_for_verl(_unchecked_batch(sample), [4])


def _unchecked_batch(sample: SampleRoutes) -> RouteBatch:
    return RouteBatch.from_sequences(
        [torch.from_numpy(sample.routes_TLK)], DENSE_FIRST, valid=[sample.valid_T], validate=False
    )


def test_zero_filled_capture_from_the_engine_raises() -> None:
    ids = distinct_routes(DENSE_FIRST, 8)
    answer = vllm_request_output(
        VllmEra.V0_22,
        prompt_ids=[1] * 4,
        generated_ids=[2] * 5,
        routes_TLK=ids,
        num_experts=16,
        faults=Faults(all_zero=True),
        use_real_vllm=False,
    )
    with pytest.raises(RouteValidationError, match=r"zero-filled its routes \(E1\)"):
        pack_for_verl(decode_vllm_output(answer, DecodeOptions(meta=DENSE_FIRST)), DENSE_FIRST)


def test_wrong_layer_count_raises() -> None:
    ids = distinct_routes(make_meta(num_experts=16, layers=4, top_k=4), 8)
    with pytest.raises(EngineOutputError, match=r"expected \[rows, 5, 4\] \(all 5 decoder"):
        decode_routes_array(
            ids, DecodeOptions(meta=DENSE_FIRST), num_prompt_tokens=4, num_generated_tokens=5
        ).only()
    moe_axis = RouteMeta(num_experts=16, top_k=4, layer_axis="moe_layers", layer_numbers=(2, 3))
    with pytest.raises(RouteValidationError, match="all_layers axis"):
        pack_for_verl([], moe_axis)


def test_wrong_row_count_and_dropped_samples_raise() -> None:
    ids = distinct_routes(DENSE_FIRST, 6)
    with pytest.raises(AlignmentError):
        decode_routes_array(
            ids, DecodeOptions(meta=DENSE_FIRST), num_prompt_tokens=4, num_generated_tokens=5
        ).only()
    with pytest.raises(EngineOutputError, match="sample 0 is None"):
        pack_for_verl([None], DENSE_FIRST)
    with pytest.raises(CodecError, match="unknown codec"):
        pack_for_verl(rollout("vllm_uint8", DENSE_FIRST).samples, DENSE_FIRST, codec="zip")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_concat_equals_one_encoding(layout: str, codec: str) -> None:
    meta = LAYOUTS[layout]
    r = rollout("vllm_uint8", meta)
    whole = pack_for_verl(r.samples, meta, codec=codec)
    joined = concat_verl_routes([pack_for_verl([s], meta, codec=codec) for s in r.samples])
    assert joined.num_prompt_tokens == whole.num_prompt_tokens
    assert torch.equal(joined.encoded.offsets_B1, whole.encoded.offsets_B1)
    assert torch.equal(joined.encoded.valid_bits, whole.encoded.valid_bits)
    assert torch.equal(joined.encoded.payload, whole.encoded.payload)  # whichever path it took
    assert torch.equal(to_verl_nested(joined).values(), to_verl_nested(whole).values())


def test_concat_refuses_mixed_parts() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    a = pack_for_verl(r.samples[:1], DENSE_FIRST, codec="packed")
    with pytest.raises(CodecError, match="encode every part alike"):
        concat_verl_routes([a, pack_for_verl(r.samples[1:2], DENSE_FIRST, codec="set")])
    with pytest.raises(AlignmentError):
        concat_verl_routes([])
    assert concat_verl_routes([a]) is a


def test_response_length_cuts_as_verl_does() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    routes = pack_for_verl(r.samples, DENSE_FIRST, response_length=4)
    assert routes.lengths == tuple(p + min(g, 4) for p, g in SHAPES)
    nested = to_verl_nested(routes)
    for part, rows in zip(nested.unbind(), r.engine_rows, strict=True):
        n = min(rows.shape[0], part.shape[0])
        assert torch.equal(part[:n], torch.from_numpy(rows[:n].astype(np.int16)))
    with pytest.raises(AlignmentError, match="truncate the response"):
        to_verl_padded(pack_for_verl(r.samples, DENSE_FIRST), prompt_length=8, response_length=4)


def test_rows_verl_would_replay_without_a_route_raise() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    turn = r.samples[0]
    assert turn is not None
    tool = assemble_multi_turn(turn, num_tokens=turn.routes_TLK.shape[0] + 3, num_prompt_tokens=5)
    aborted = decode_routes_array(
        None,
        DecodeOptions(meta=DENSE_FIRST),
        num_prompt_tokens=3,
        num_generated_tokens=2,
        finish_reason="abort",
    ).only()
    routes = pack_for_verl([tool, r.samples[1], aborted], DENSE_FIRST)
    assert unreplayable_rows(routes) == [(0, [8, 9, 10]), (2, [0, 1, 2, 3])]
    for convert in (
        lambda **kw: to_verl_nested(routes, **kw),
        lambda **kw: to_verl_padded(routes, prompt_length=8, response_length=9, **kw),
    ):
        with pytest.raises(EngineOutputError, match=r"sample 0 .*rows \[8, 9, 10\].*strict=False"):
            convert()
        assert convert(strict=False).dtype == torch.int16
    assert unreplayable_rows(pack_for_verl(r.samples, DENSE_FIRST)) == []


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("max_blocks", [0, 1 << 14], ids=["by_mask", "by_slices"])
def test_expansion_equals_decode_routes(
    codec: str, max_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interleaved dense layers (several slot ranges), tool rows without a route: both ways of
    writing the ids into place give rr_core's decode, cast to int16."""
    monkeypatch.setattr(scatter, "MAX_BLOCKS", max_blocks)
    meta = make_meta(num_experts=16, dense=(1, 3), layers=6, top_k=4)
    r = rollout("vllm_uint8", meta)
    turn = r.samples[2]
    assert turn is not None
    r.samples[2] = assemble_multi_turn(turn, num_tokens=16, num_prompt_tokens=7)
    routes = pack_for_verl(r.samples, meta, codec=codec)
    nested = to_verl_nested(routes, strict=False)
    want = decode_routes(routes.encoded)
    assert torch.equal(nested.values(), want.values_NLK.to(torch.int16))
    assert torch.equal(nested.offsets(), want.offsets_B1)


def test_prompt_lengths_are_checked() -> None:
    routes = pack_for_verl(rollout("vllm_uint8", DENSE_FIRST).samples, DENSE_FIRST)
    with pytest.raises(AlignmentError, match="4 prompt lengths for 5 samples"):
        VerlRoutes(encoded=routes.encoded, num_prompt_tokens=routes.num_prompt_tokens[:4])
    with pytest.raises(AlignmentError, match=r"sample 1 has 4 tokens, so P=9"):
        VerlRoutes(encoded=routes.encoded, num_prompt_tokens=(5, 9, 7, 2, 6))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_only_the_payload_moves_to_the_device() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    routes = pack_for_verl(r.samples, DENSE_FIRST, codec="packed")
    nested = to_verl_nested(routes, device="cuda")
    assert nested.values().is_cuda
    assert nested.offsets().is_cuda
    assert torch.equal(nested.values().cpu(), expected_nested_values(r))
    padded = to_verl_padded(routes, prompt_length=8, response_length=9, device="cuda")
    assert torch.equal(padded.cpu(), expected_padded(r, 8, 9))
