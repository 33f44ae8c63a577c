"""Requests that end early on the real engine: by ``max_tokens``, by a stop string, aborted.

What vLLM 0.30 returns, and what rr_vllm makes of it:

- ``max_tokens``: ``finish_reason='length'``, ``P + G - 1 - start`` rows; decoded with every
  row valid.
- a stop string: ``finish_reason='stop'``, ``stop_reason`` the string; the token that completed
  it stays in ``token_ids`` (the text is cut), and the rows cover every token id, so the routes
  are the first rows of the same request run without the stop string.
- the offline ``LLMEngine`` (``add_request`` / ``step`` / ``abort_request``): an aborted
  request never gets a final output; the cumulative outputs before it have
  ``finish_reason=None`` and ``routed_experts=None`` (routes come only with the final one), and
  rr_vllm refuses to decode them, naming the request unfinished (not capture, D3).
- ``AsyncLLM.abort`` (what a server and partial rollouts use): a final output with
  ``finish_reason='abort'`` and the rows of every token generated so far,
  ``P + G - 1 - start``, equal to those of the same request stopped at the same length by
  ``max_tokens``; rr_vllm masks the sample (``on_abort='mask'``: every row invalid) or drops it
  (``'drop'``), and ``Trajectory`` refuses the turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from engine_rollouts import MAX_MODEL_LEN

from rr_fakes.shims.hf_checkpoints import build_checkpoint
from rr_vllm import (
    EngineOutputError,
    ModelGeometry,
    Trajectory,
    decode_vllm_batch,
    decode_vllm_output,
    vllm_engine_args,
)

FAMILY, FP32 = "qwen3_moe", "float32"
START = 4  # routed_experts_prompt_start of every request here


def _prompt(seed: int, n: int = 20) -> list[int]:
    ck = build_checkpoint(FAMILY)
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, ck.vocab_size, size=n)]


def _params(**kw: Any) -> Any:
    from vllm import SamplingParams

    fields = {"temperature": 1.0, "ignore_eos": True, "routed_experts_prompt_start": START}
    return SamplingParams(**{**fields, **kw})


def _generate(engines: Any, prompt: list[int], params: Any) -> Any:
    from vllm.inputs import TokensPrompt

    llm = engines.get(build_checkpoint(FAMILY), FP32)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return out


def _rows_valid(out: Any, *, start: int = START) -> np.ndarray:
    (sample,) = decode_vllm_output(out, build_checkpoint(FAMILY).route_meta(), prompt_start=start)
    assert sample is not None
    return np.asarray(sample.valid_T)


def test_max_tokens_ends_with_every_row(engines) -> None:
    prompt = _prompt(1)
    out = _generate(engines, prompt, _params(max_tokens=6, seed=5))
    (c,) = out.outputs
    assert c.finish_reason == "length"
    assert c.stop_reason is None
    assert len(c.token_ids) == 6
    assert c.routed_experts.shape[0] == len(prompt) + 6 - 1 - START
    valid = _rows_valid(out)
    assert valid.sum() == c.routed_experts.shape[0]
    assert not valid[:START].any()


def test_a_stop_string_keeps_the_token_that_completed_it_and_its_rows(engines) -> None:
    prompt = _prompt(2)
    free = _generate(engines, prompt, _params(max_tokens=16, seed=6)).outputs[0]
    ids = list(free.token_ids)
    stop = f" w{ids[5]}"  # the word-level tokenizer's text of token 5 (token i is "w{i}")
    # the first token whose text completes the stop string (an earlier token may contain it)
    k = next(i for i in range(len(ids)) if stop in "".join(f" w{t}" for t in ids[: i + 1]))
    out = _generate(engines, prompt, _params(max_tokens=16, seed=6, stop=[stop]))
    (c,) = out.outputs
    assert c.finish_reason == "stop"
    assert c.stop_reason == stop
    assert list(c.token_ids) == ids[: k + 1]  # the completing token is a generated token
    assert stop not in c.text  # only the text is cut
    G = k + 1
    assert c.routed_experts.shape[0] == len(prompt) + G - 1 - START
    np.testing.assert_array_equal(
        c.routed_experts, free.routed_experts[: c.routed_experts.shape[0]]
    )
    assert _rows_valid(out).sum() == len(prompt) + G - 1 - START


def _step_until(engine: Any, request_id: str, tokens: int) -> Any:
    last = None
    while last is None or len(last.outputs[0].token_ids) < tokens:
        for out in engine.step():
            if out.request_id == request_id:
                last = out
    return last


def test_an_offline_engine_abort_leaves_only_unfinished_outputs(engines) -> None:
    from vllm.inputs import TokensPrompt

    engine = engines.get(build_checkpoint(FAMILY), FP32).llm_engine
    prompt = _prompt(3)
    engine.add_request("abort-me", TokensPrompt(prompt_token_ids=prompt), _params(seed=7))
    partial = _step_until(engine, "abort-me", 3)
    (c,) = partial.outputs
    assert not partial.finished
    assert c.finish_reason is None
    assert c.routed_experts is None  # routes come with the final output only
    engine.abort_request(["abort-me"])
    after = [o for _ in range(3) for o in engine.step()]
    assert after == []  # no final output for an aborted request
    assert not engine.has_unfinished_requests()
    with pytest.raises(EngineOutputError, match="routed experts are None"):
        decode_vllm_output(partial, build_checkpoint(FAMILY).route_meta(), prompt_start=START)


def test_an_unfinished_output_is_named_unfinished(engines) -> None:
    from vllm.inputs import TokensPrompt

    engine = engines.get(build_checkpoint(FAMILY), FP32).llm_engine
    engine.add_request("unfinished", TokensPrompt(prompt_token_ids=_prompt(4)), _params(seed=8))
    partial = _step_until(engine, "unfinished", 2)
    engine.abort_request(["unfinished"])
    with pytest.raises(EngineOutputError) as info:
        decode_vllm_output(partial, build_checkpoint(FAMILY).route_meta(), prompt_start=START)
    assert "capture is off" not in str(info.value)
    assert "not finished" in str(info.value)


async def _abort_and_rerun(ck: Any, prompt: list[int], after_tokens: int) -> tuple[Any, Any]:
    """An AsyncLLM request aborted once it generated ``after_tokens`` tokens, and the same
    request (same seed) run to the same length by ``max_tokens``."""
    from transformers import AutoConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    capture = vllm_engine_args(ModelGeometry.from_hf_config(AutoConfig.from_pretrained(ck.path)))
    args = AsyncEngineArgs(
        model=str(ck.path),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        dtype=FP32,
        enable_prefix_caching=True,
        **capture,
    )
    llm = AsyncLLM.from_engine_args(args)
    try:
        seen: list[Any] = []
        params = _params(
            seed=9,
            max_tokens=MAX_MODEL_LEN - len(prompt),
            output_kind=RequestOutputKind.CUMULATIVE,
        )

        async def consume() -> None:
            async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, "a"):
                seen.append(out)

        task = asyncio.create_task(consume())
        while not seen or len(seen[-1].outputs[0].token_ids) < after_tokens:
            await asyncio.sleep(0.005)
        await llm.abort("a")
        await asyncio.wait_for(task, 30)
        aborted = seen[-1]
        G = len(aborted.outputs[0].token_ids)
        rerun = None
        async for out in llm.generate(
            TokensPrompt(prompt_token_ids=prompt), _params(seed=9, max_tokens=G), "b"
        ):
            rerun = out
        return aborted, rerun
    finally:
        llm.shutdown()


def test_an_async_abort_returns_the_rows_so_far_and_rr_masks_them(engines) -> None:
    ck = build_checkpoint(FAMILY)
    meta = ck.route_meta()
    engines.close()  # one engine at a time: the AsyncLLM below runs alone
    prompt = _prompt(5)
    aborted, rerun = asyncio.run(_abort_and_rerun(ck, prompt, after_tokens=8))
    (c,) = aborted.outputs
    G = len(c.token_ids)
    assert aborted.finished
    assert c.finish_reason == "abort"
    assert G >= 8
    assert c.routed_experts.shape == (len(prompt) + G - 1 - START, ck.num_hidden_layers, ck.top_k)
    (r,) = rerun.outputs
    assert r.finish_reason == "length"
    assert list(r.token_ids) == list(c.token_ids)  # same prompt and seed
    np.testing.assert_array_equal(c.routed_experts, r.routed_experts)  # the real routes

    (masked,) = decode_vllm_output(aborted, meta, prompt_start=START)
    assert masked is not None
    assert masked.routes_TLK.shape[0] == len(prompt) + G
    assert not np.asarray(masked.valid_T).any()  # rr discards an aborted request's rows
    assert decode_vllm_output(aborted, meta, prompt_start=START, on_abort="drop") == [None]
    batch = decode_vllm_batch([aborted, rerun], meta, prompt_start=START)
    assert batch.lengths.tolist() == [len(prompt) + G] * 2
    valid = batch.valid_N.view(2, -1)
    assert not valid[0].any()
    assert int(valid[1].sum()) == len(prompt) + G - 1 - START
    trajectory = Trajectory(meta, num_prompt_tokens=len(prompt))
    with pytest.raises(EngineOutputError, match="aborted"):
        trajectory.add_vllm_output(aborted, prompt_start=START)
