"""Assembly: resumed partial rollouts (D2, D4), multi-turn with tool tokens (D2), truncation (D7),
stop-string trimming, n > 1, 0.21 over HTTP (E5), dtypes and the trainer's padded layout.

Shapes: T tokens, L layer slots (all_layers axis), K top-k, E experts, B samples, S padded length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import AlignmentError, RouteBatch, RouteMeta, RouteValidationError
from rr_fakes.emulations.engines import Faults, VllmEra, vllm_http_response
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    SampleRoutes,
    assemble_multi_turn,
    assemble_resumed,
    decode_routes_array,
    decode_vllm_http,
    decode_vllm_output,
    flatten_completions,
    to_trainer_layout,
    truncate_response,
    truncate_sample,
    validate_samples,
)
from vllm_testing import META, distinct_routes, fake_vllm_output

L, K = 4, 2


def routes(rows: int, seed: int = 0, meta: RouteMeta = META) -> np.ndarray:
    return distinct_routes(meta, rows, seed)


def request(era: VllmEra, prompt: int, generated: int, rows: np.ndarray, **kw: Any) -> Any:
    return fake_vllm_output(era, META, rows, prompt, generated, **kw)


def decode_one(out: Any, **kw: Any) -> SampleRoutes:
    (s,) = decode_vllm_output(out, DecodeOptions(meta=META, **kw))
    assert s is not None
    return s


# --- partial-rollout resume ---------------------------------------------------------------------


def attempts_of(
    full: np.ndarray, p: int, new: list[int], era: VllmEra = VllmEra.V0_22
) -> list[SampleRoutes]:
    """Attempt k is sent the prompt plus every earlier token; its prefill re-routes the context
    (other ids than the first pass: weights moved), so only its new rows may be kept."""
    out, ctx = [], p
    for k, g in enumerate(new):
        end = ctx + g
        rows = full[: end - 1].copy()
        if k:
            rows[: ctx - 1] = routes(ctx - 1, seed=100 + k)  # re-routed context
        out.append(decode_one(request(era, ctx, g, rows)))
        ctx = end
    return out


@pytest.mark.parametrize("new", [[4], [3, 2], [2, 3, 4], [1, 1, 1]])
@pytest.mark.parametrize("era", [VllmEra.V0_14, VllmEra.V0_22, VllmEra.V0_32])
def test_d2_resume_keeps_the_first_attempt_and_appends_new_rows(
    new: list[int], era: VllmEra
) -> None:
    p = 5
    full = routes(p + sum(new) - 1)
    s = assemble_resumed(attempts_of(full, p, new, era), new, num_prompt_tokens=p)
    assert s.num_prompt_tokens == p
    assert s.routes_TLK.shape[0] == p + sum(new)
    np.testing.assert_array_equal(s.routes_TLK[:-1], full)
    assert s.valid_T[:-1].all()
    assert not s.valid_T[-1]
    validate_samples([s], META)


def test_d2_resume_skips_attempts_without_tokens_or_routes() -> None:
    p, new = 5, [3, 0, 2]
    full = routes(p + 5 - 1)
    a = attempts_of(full, p, [3, 2])
    s = assemble_resumed([a[0], None, a[1]], new, num_prompt_tokens=p)
    np.testing.assert_array_equal(s.routes_TLK[:-1], full)


def test_d4_resume_after_an_aborted_attempt_leaves_its_rows_invalid() -> None:
    p, new = 4, [2, 3, 2]
    full = routes(p + sum(new) - 1)
    a = attempts_of(full, p, new)
    aborted = dataclasses.replace(a[1], valid_T=np.zeros_like(a[1].valid_T), finish_reason="abort")
    s = assemble_resumed([a[0], aborted, a[2]], new, num_prompt_tokens=p)
    expected = np.ones(p + sum(new), dtype=bool)
    expected[p + 1 : p + 4] = False  # attempt 1's rows (positions ctx-1 .. end-2) are lost
    expected[-1] = False
    np.testing.assert_array_equal(s.valid_T, expected)
    assert not s.routes_TLK[~s.valid_T].any()  # never expert 0 replayed as real
    np.testing.assert_array_equal(s.routes_TLK[s.valid_T], full[s.valid_T[:-1]])
    validate_samples([s], META)


def test_d2_resume_first_attempt_without_routes() -> None:
    p, new = 4, [2, 3]
    full = routes(p + 4)
    a = attempts_of(full, p, new)
    s = assemble_resumed([None, a[1]], new, num_prompt_tokens=p)
    np.testing.assert_array_equal(s.routes_TLK, a[1].routes_TLK)  # the first with routes: all


def test_d2_resume_refuses_misordered_attempts() -> None:
    p, new = 5, [3, 2]
    a = attempts_of(routes(p + 4), p, new)
    with pytest.raises(AlignmentError, match=r"attempt 0.*expected context 5"):
        assemble_resumed([a[1], a[0]], new, num_prompt_tokens=p)
    with pytest.raises(AlignmentError, match="one token count per attempt"):
        assemble_resumed(a, [3], num_prompt_tokens=p)
    with pytest.raises(AlignmentError, match="no attempt carries routes"):
        assemble_resumed([None, None], new, num_prompt_tokens=p)


def test_resume_does_not_write_to_read_only_attempts() -> None:
    p, new = 5, [3, 2]
    a = attempts_of(routes(p + 4), p, new)
    for s in a:
        s.routes_TLK.setflags(write=False)
    out = assemble_resumed(a, new, num_prompt_tokens=p)
    assert out.routes_TLK.flags.writeable


# --- multi-turn ---------------------------------------------------------------------------------


def test_d2_multi_turn_tool_tokens_after_the_last_generation_are_invalid() -> None:
    # turn 1: prompt 4, gen 3; tool output 2 tokens; turn 2: context 9, gen 3; tool output 4 more
    p, ctx, g, tool = 4, 9, 3, 4
    last = decode_one(request(VllmEra.V0_32, ctx, g, routes(ctx + g - 1)))
    s = assemble_multi_turn(last, num_tokens=ctx + g + tool, num_prompt_tokens=p)
    assert s.num_prompt_tokens == p
    assert s.routes_TLK.shape[0] == ctx + g + tool
    np.testing.assert_array_equal(s.routes_TLK[: ctx + g], last.routes_TLK)
    assert not s.valid_T[ctx + g - 1 :].any()
    assert not s.routes_TLK[ctx + g :].any()
    batch = validate_samples([s], META)
    assert int(batch.valid_N.sum()) == ctx + g - 1


def test_d2_multi_turn_refuses_a_shorter_trajectory() -> None:
    last = decode_one(request(VllmEra.V0_22, 6, 3, routes(8)))
    with pytest.raises(AlignmentError, match="D2"):
        assemble_multi_turn(last, num_tokens=8, num_prompt_tokens=4)
    with pytest.raises(AlignmentError, match="D2"):
        assemble_multi_turn(last, num_tokens=12, num_prompt_tokens=7)


def test_d7_multi_turn_then_truncation() -> None:
    last = decode_one(request(VllmEra.V0_22, 6, 3, routes(8)))
    s = truncate_response(assemble_multi_turn(last, num_tokens=12, num_prompt_tokens=4), 5)
    assert s.routes_TLK.shape[0] == 9
    assert s.valid_T[:-1].all()  # the last generated token has no route
    assert not s.valid_T[-1]


# --- truncation and stop strings ----------------------------------------------------------------


def test_d7_truncating_the_response_truncates_its_routes() -> None:
    s = decode_one(request(VllmEra.V0_22, 5, 6, routes(10)))
    cut = truncate_response(s, 2)
    assert cut.routes_TLK.shape[0] == 7
    assert np.shares_memory(cut.routes_TLK, s.routes_TLK)  # a view
    assert cut.valid_T.all()
    assert truncate_response(s, 100).routes_TLK.shape[0] == 11
    with pytest.raises(AlignmentError, match="D7"):
        truncate_sample(s, 12)
    with pytest.raises(AlignmentError, match="D7"):
        truncate_sample(s, 4)


def test_d7_stop_string_trimming_trims_rows_with_tokens() -> None:
    full = routes(10)
    out = request(VllmEra.V0_32, 5, 6, full, finish_reason="stop")
    c = out.outputs[0]
    c.token_ids, c.routed_experts = c.token_ids[:4], c.routed_experts[: 5 + 4 - 1]
    s = decode_one(out)
    np.testing.assert_array_equal(s.routes_TLK[:-1], full[:8])
    c.routed_experts = full.astype(np.uint8)  # tokens trimmed, rows not
    with pytest.raises(AlignmentError, match="D7"):
        decode_one(out)


# --- n > 1 and batching -------------------------------------------------------------------------


def test_n_completions_flatten_request_major() -> None:
    outs = []
    for r in range(2):
        out = request(VllmEra.V0_22, 3, 2, routes(4, seed=r))
        second = request(VllmEra.V0_22, 3, 4, routes(6, seed=10 + r)).outputs[0]
        out.outputs.append(dataclasses.replace(second, index=1))
        outs.append(out)
    samples = flatten_completions([decode_vllm_output(o, DecodeOptions(meta=META)) for o in outs])
    assert [s.routes_TLK.shape[0] for s in samples if s is not None] == [5, 7, 5, 7]
    batch = validate_samples(samples, META)
    assert batch.lengths.tolist() == [5, 7, 5, 7]
    assert batch.values_NLK.dtype == torch.uint8


def test_dropped_abort_in_a_batch_is_named() -> None:
    out = request(VllmEra.V0_22, 3, 2, routes(4), faults=Faults(abort_after_rows=1))
    samples = decode_vllm_output(out, DecodeOptions(meta=META, on_abort="drop"))
    with pytest.raises(EngineOutputError, match="sample 0 is None"):
        validate_samples(samples, META)


# --- dtypes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint16, np.int32, np.int64])
def test_every_integer_input_dtype(dtype: type) -> None:
    rows = routes(8).astype(dtype)
    s = decode_routes_array(
        rows, DecodeOptions(meta=META), num_prompt_tokens=5, num_generated_tokens=4
    ).only()
    assert s is not None
    batch = validate_samples([s], META)
    assert batch.values_NLK.dtype == torch.uint8
    assert torch.equal(batch.values_NLK[:-1].to(torch.int64), torch.from_numpy(routes(8)))


@pytest.mark.parametrize("dtype", [np.int16, np.int64])
def test_negative_ids_in_wide_dtypes_are_refused(dtype: type) -> None:
    rows = routes(8).astype(dtype)
    rows[2, 1] = [-1, 3]
    s = decode_routes_array(
        rows, DecodeOptions(meta=META), num_prompt_tokens=5, num_generated_tokens=4
    ).only()
    with pytest.raises(RouteValidationError, match="min -1"):
        validate_samples([s], META)


# --- vLLM 0.21 over HTTP (E5) -------------------------------------------------------------------


@pytest.mark.parametrize("version", [None, "0.21.0"])
def test_e5_v021_http_carries_only_generation_rows(version: str | None) -> None:
    full = routes(8)
    body = vllm_http_response(request(VllmEra.V0_21, 5, 4, full, cached_prefix=2))
    with pytest.raises(EngineOutputError, match="only the 3 generation rows"):
        decode_vllm_http(body, DecodeOptions(meta=META, engine_version=version))
    (s,) = decode_vllm_http(
        body, DecodeOptions(meta=META, engine_version=version, generation_only=True)
    )
    assert s is not None
    expected = np.zeros(9, dtype=bool)
    expected[5:8] = True
    np.testing.assert_array_equal(s.valid_T, expected)
    np.testing.assert_array_equal(s.routes_TLK[5:8], full[5:])
    assert not s.routes_TLK[:5].any()
    validate_samples([s], META)
    with pytest.raises(EngineOutputError, match="prompt_start"):
        decode_vllm_http(body, DecodeOptions(meta=META, generation_only=True, prompt_start=1))


# --- the trainer's padded layout ----------------------------------------------------------------


def test_trainer_layout_left_pads_prompts_and_right_pads_responses() -> None:
    shapes = [(3, 4), (5, 2), (1, 6)]  # (P, G)
    samples = [
        decode_one(request(VllmEra.V0_22, p, g, routes(p + g - 1, seed=i)))
        for i, (p, g) in enumerate(shapes)
    ]
    batch = validate_samples(samples, META)
    layout = to_trainer_layout(batch, [p for p, _ in shapes], prompt_length=6, response_length=6)
    assert layout.routes_BSLK.shape == (3, 12, L, K)
    assert layout.routes_BSLK.dtype == torch.int16
    for b, ((p, g), s) in enumerate(zip(shapes, samples, strict=True)):
        window = slice(6 - p, 6 + g)
        assert torch.equal(layout.routes_BSLK[b, window], torch.from_numpy(s.routes_TLK).short())
        assert layout.valid_BS[b, window].tolist() == s.valid_T.tolist()
        assert layout.token_mask_BS[b].sum() == p + g
        assert layout.token_mask_BS[b, window].all()
        assert not layout.routes_BSLK[b, ~layout.token_mask_BS[b]].any()
    back = RouteBatch.from_padded(
        layout.routes_BSLK, layout.token_mask_BS, META, valid_BS=layout.valid_BS
    )
    assert back.equal(batch)


def test_d7_trainer_layout_refuses_untruncated_responses() -> None:
    s = decode_one(request(VllmEra.V0_22, 3, 5, routes(7)))
    batch = validate_samples([s], META)
    with pytest.raises(AlignmentError, match="D7"):
        to_trainer_layout(batch, [3], prompt_length=4, response_length=4)
    with pytest.raises(AlignmentError, match="P=3"):
        to_trainer_layout(batch, [3], prompt_length=2, response_length=8)
    cut = validate_samples([truncate_response(s, 4)], META)
    layout = to_trainer_layout(cut, [3], prompt_length=4, response_length=4)
    assert layout.valid_BS.tolist() == [[False, True, True, True, True, True, True, True]]
    with pytest.raises(AlignmentError, match="prompt lengths"):
        to_trainer_layout(batch, [3, 3], prompt_length=4, response_length=8)
    with pytest.raises(AlignmentError, match="cannot hold"):
        to_trainer_layout(batch, [3], prompt_length=4, response_length=8, dtype=torch.float32)
