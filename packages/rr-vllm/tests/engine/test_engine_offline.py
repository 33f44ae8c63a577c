"""Offline ``LLM.generate`` routes from the real engine, decoded and validated by rr_vllm's
public decoders as this release returns them.

What must hold, on every family's float32 rollout: ``CompletionOutput.routed_experts`` is
uint8 ``[P + G - 1 - prompt_start, num_hidden_layers, K]``, one slot per decoder layer with the
dense layers' slots all zero; rr_vllm decodes it per request and per batch to the same routes,
with exactly the engine's rows valid; a request sent with a prompt start gets the tail of the
rows the same request gets from 0; n > 1 completions share their prompt rows; a stop token and
``max_model_len`` end a request with its rows complete; the prefix cache hands back the routes
of the cached block as the first request computed them, and turning it off changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_rollouts import BLOCK, MAX_MODEL_LEN, MLA_FAMILIES, rollout

from rr_core import RRError
from rr_fakes.shims.hf_checkpoints import FAMILIES
from rr_vllm import (
    decode_vllm_batch,
    decode_vllm_output,
    flatten_completions,
    validate_samples,
)

FP32 = "float32"
MLA_BATCH_DEPENDENT = (
    "vLLM 0.30's CPU MLA attention (CPU_MLA) routes the same prompt tokens differently "
    "depending on the batch they are in (the n=2 completions' prompt rows, or one prompt sent "
    "twice, differ in float32): an engine defect, not rr's"
)


@pytest.mark.parametrize("family", FAMILIES)
def test_routes_cover_every_layer_with_empty_dense_slots(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    ck = roll.checkpoint
    meta = ck.route_meta()
    dense = [n - 1 for n in ck.dense_layer_numbers]
    moe = [n - 1 for n in ck.moe_layer_numbers]
    for request, out in zip(roll.requests, roll.outputs, strict=True):
        P = len(out.prompt_token_ids)
        assert list(out.prompt_token_ids) == list(request.prompt)
        assert len(out.outputs) == request.n
        for c in out.outputs:
            rows = c.routed_experts
            G = len(c.token_ids)
            assert isinstance(rows, np.ndarray)
            assert rows.dtype == np.uint8  # E <= 256
            assert rows.shape == (P + G - 1 - request.prompt_start, ck.num_hidden_layers, ck.top_k)
            assert not rows[:, dense].any(), "a dense layer's slot carries ids"
            ids = rows[:, moe].astype(np.int64)
            assert ids.max() < ck.num_experts
            assert (np.sort(ids, -1)[..., 1:] != np.sort(ids, -1)[..., :-1]).all()
        samples = decode_vllm_output(out, meta, prompt_start=request.prompt_start)
        for s, c in zip(samples, out.outputs, strict=True):
            assert s is not None
            G = len(c.token_ids)
            assert s.routes_TLK.shape[0] == P + G
            valid = np.asarray(s.valid_T)
            assert valid.sum() == P + G - 1 - request.prompt_start
            assert not valid[: request.prompt_start].any()
            assert not valid[-1]
            np.testing.assert_array_equal(
                np.asarray(s.routes_TLK)[valid], c.routed_experts.astype(np.int64)
            )
        validate_samples(samples, meta)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_batch_decoder_equals_the_per_request_path(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    meta = roll.checkpoint.route_meta()
    batch = roll.batch()  # one prompt start per request
    per_request = validate_samples(
        flatten_completions(
            [
                decode_vllm_output(o, meta, prompt_start=r.prompt_start)
                for r, o in zip(roll.requests, roll.outputs, strict=True)
            ]
        ),
        meta,
    )
    assert batch.lengths.tolist() == per_request.lengths.tolist()
    assert batch.valid_N.tolist() == per_request.valid_N.tolist()
    assert (
        batch.values_NLK.long()[batch.valid_N] == per_request.values_NLK.long()[per_request.valid_N]
    ).all()
    # one start for the whole batch is wrong where the requests were sent with different ones
    with pytest.raises(RRError, match="route rows"):
        decode_vllm_batch(roll.outputs, meta, prompt_start=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_start_returns_the_tail_of_the_rows(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    request, first = roll.by_name("short")
    again, second = roll.by_name("short_again")
    start, P = again.prompt_start, len(request.prompt)
    assert start > 0
    (a,), (b,) = first.outputs, second.outputs
    assert b.routed_experts.shape[0] == P + len(b.token_ids) - 1 - start
    if family in MLA_FAMILIES and not np.array_equal(
        b.routed_experts[: P - start], a.routed_experts[start:P]
    ):
        pytest.xfail(MLA_BATCH_DEPENDENT)
    # the prompt's rows (prefill of the same tokens)
    np.testing.assert_array_equal(b.routed_experts[: P - start], a.routed_experts[start:P])
    if family in MLA_FAMILIES and list(a.token_ids) != list(b.token_ids):
        pytest.xfail(MLA_BATCH_DEPENDENT)
    assert list(a.token_ids) == list(b.token_ids)  # same prompt and seed
    np.testing.assert_array_equal(b.routed_experts, a.routed_experts[start:])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_whole_prompt_as_start_returns_the_generation_rows(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    request, first = roll.by_name("short")
    whole, out = roll.by_name("short_whole")
    P = len(request.prompt)
    assert whole.prompt_start == P  # sent as asked: this release serves it (rr_vllm flags)
    (a,), (c,) = first.outputs, out.outputs
    assert c.routed_experts.shape[0] == len(c.token_ids) - 1
    (s,) = decode_vllm_output(out, roll.checkpoint.route_meta(), prompt_start=P)
    assert s is not None
    assert int(np.asarray(s.valid_T).sum()) == len(c.token_ids) - 1
    if family in MLA_FAMILIES and list(a.token_ids) != list(c.token_ids):
        pytest.xfail(MLA_BATCH_DEPENDENT)
    np.testing.assert_array_equal(c.routed_experts, a.routed_experts[P:])


@pytest.mark.parametrize("family", FAMILIES)
def test_n_completions_share_their_prompt_rows(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    request, out = roll.by_name("n2")
    P = len(request.prompt)
    c0, c1 = out.outputs
    assert [c0.index, c1.index] == [0, 1]
    batch = roll.batch()
    names = [r.name for r in roll.requests for _ in range(r.n)]
    first = names.index("n2")
    for j, c in enumerate(out.outputs):  # request-major: the completions in index order
        values, valid = batch.sequence(first + j)
        np.testing.assert_array_equal(values[valid].numpy(), c.routed_experts)
    same = np.array_equal(c0.routed_experts[: P - 1], c1.routed_experts[: P - 1])
    if family in MLA_FAMILIES and not same:
        pytest.xfail(MLA_BATCH_DEPENDENT)
    np.testing.assert_array_equal(c0.routed_experts[: P - 1], c1.routed_experts[: P - 1])


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_and_max_length_end_with_complete_rows(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    request, out = roll.by_name("stop")
    (c,) = out.outputs
    assert c.finish_reason == "stop"
    assert c.token_ids[-1] in request.stop_token_ids  # the stop token is a generated token
    assert c.routed_experts.shape[0] == len(request.prompt) + len(c.token_ids) - 1
    request, out = roll.by_name("max_len")
    (c,) = out.outputs
    assert c.finish_reason == "length"
    assert len(request.prompt) + len(c.token_ids) == MAX_MODEL_LEN
    assert c.routed_experts.shape[0] == MAX_MODEL_LEN - 1


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in MLA_FAMILIES])
def test_the_prefix_cache_returns_the_cached_rows(engines, family: str) -> None:
    roll = rollout(engines, family, FP32)
    _, long = roll.by_name("long")
    _, hit = roll.by_name("long_hit")
    assert hit.num_cached_tokens == BLOCK  # the first block came from the cache
    np.testing.assert_array_equal(
        hit.outputs[0].routed_experts[:BLOCK], long.outputs[0].routed_experts[:BLOCK]
    )


def test_prefix_caching_off_returns_the_same_routes(engines) -> None:
    on = rollout(engines, "qwen3_moe", FP32)
    off = rollout(engines, "qwen3_moe", FP32, prefix_caching=False)
    assert all(o.num_cached_tokens == 0 for o in off.outputs)
    assert any(o.num_cached_tokens for o in on.outputs)
    for a, b in zip(on.outputs, off.outputs, strict=True):
        for ca, cb in zip(a.outputs, b.outputs, strict=True):
            assert list(ca.token_ids) == list(cb.token_ids)
            np.testing.assert_array_equal(ca.routed_experts, cb.routed_experts)
