"""A multi-turn conversation through the real engine, gathered by rr_vllm's ``Trajectory``.

Each turn's prompt is the previous prompt, the previous completion and new user tokens, sent
with ``routed_experts_prompt_start = trajectory.prompt_start(prompt)`` (the tokens already
routed), so each turn returns only its new rows. What must hold on a float32 qwen3_moe engine:
the stitched routes equal those of one request over the whole final conversation, with prefix
caching on (its first block comes from the cache; vLLM 0.30 fills in the cached rows) and off;
a prompt that does not extend the routed tokens is refused on real outputs; and the stitched
routes replay in transformers with zero (token, MoE layer) mismatches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from engine_rollouts import BLOCK, _Watching, trainer_model

import rr_transformers
from rr_core import ReplayMode
from rr_fakes.shims.hf_checkpoints import build_checkpoint
from rr_vllm import EngineOutputError, Trajectory, validate_samples

FAMILY, FP32 = "qwen3_moe", "float32"
FIRST_PROMPT = BLOCK + 2  # the first block is full after turn 1: turn 2 on hits the cache
USER_TOKENS, TURN_TOKENS, TURNS = 6, 8, 3


def _params(prompt_start: int, seed: int, max_tokens: int = TURN_TOKENS) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
        ignore_eos=True,
        routed_experts_prompt_start=prompt_start,
    )


def _generate(llm: Any, prompt: list[int], params: Any) -> Any:
    from vllm.inputs import TokensPrompt

    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return out


class Conversation:
    """Three turns on one engine, and one request over the whole final conversation."""

    def __init__(self, llm: Any, vocab_size: int, meta: Any) -> None:
        rng = np.random.default_rng(77)
        user = [[int(t) for t in rng.integers(3, vocab_size, size=n)] for n in (FIRST_PROMPT,)]
        user += [
            [int(t) for t in rng.integers(3, vocab_size, size=USER_TOKENS)]
            for _ in range(TURNS - 1)
        ]
        self.trajectory = Trajectory(meta, num_prompt_tokens=FIRST_PROMPT)
        self.outputs, self.starts, self.prompts = [], [], []
        tokens: list[int] = []
        for turn in range(TURNS):
            prompt = tokens + user[turn]
            start = self.trajectory.prompt_start(prompt)
            out = _generate(llm, prompt, _params(start, seed=100 + turn))
            self.trajectory.add_vllm_output(out, prompt_start=start)
            self.outputs.append(out)
            self.starts.append(start)
            self.prompts.append(prompt)
            tokens = prompt + list(out.outputs[0].token_ids)
        self.tokens = tokens
        # the whole conversation as one prompt: a row for every token (the last one's too)
        self.whole = _generate(llm, tokens, _params(0, seed=1, max_tokens=1))


_CONVERSATIONS: dict[bool, Conversation] = {}


def _conversation(engines: Any, *, prefix_caching: bool = True) -> Conversation:
    if prefix_caching not in _CONVERSATIONS:
        ck = build_checkpoint(FAMILY)
        llm = engines.get(ck, FP32, prefix_caching=prefix_caching)
        _CONVERSATIONS[prefix_caching] = Conversation(llm, ck.vocab_size, ck.route_meta())
    return _CONVERSATIONS[prefix_caching]


def test_each_turn_returns_only_its_new_rows(engines) -> None:
    conv = _conversation(engines)
    routed = 0
    for prompt, start, out in zip(conv.prompts, conv.starts, conv.outputs, strict=True):
        (c,) = out.outputs
        assert start == routed  # the tokens already routed: O(N) rows over the trajectory
        assert c.routed_experts.shape[0] == len(prompt) + len(c.token_ids) - 1 - start
        routed = len(prompt) + len(c.token_ids) - 1
    assert [o.num_cached_tokens for o in conv.outputs] == [0, BLOCK, BLOCK]
    total_rows = sum(o.outputs[0].routed_experts.shape[0] for o in conv.outputs)
    assert total_rows == len(conv.tokens) - 1  # every row came back exactly once


def test_stitched_routes_equal_one_request_over_the_conversation(engines) -> None:
    conv = _conversation(engines)
    sample = conv.trajectory.routes()
    n = len(conv.tokens)
    valid = np.asarray(sample.valid_T)
    assert sample.routes_TLK.shape[0] == n
    assert valid[:-1].all()
    assert not valid[-1]  # the last sampled token has no row
    assert conv.trajectory.mismatched_rows == 0
    assert conv.whole.num_cached_tokens >= BLOCK  # its first block came from the cache
    whole = conv.whole.outputs[0].routed_experts
    assert whole.shape[0] == n  # P + G - 1 with G = 1: a row per token of the conversation
    np.testing.assert_array_equal(np.asarray(sample.routes_TLK)[:-1], whole[: n - 1])
    validate_samples([sample], build_checkpoint(FAMILY).route_meta())


def test_prefix_caching_off_stitches_the_same_routes(engines) -> None:
    on = _conversation(engines)
    off = _conversation(engines, prefix_caching=False)
    assert all(o.num_cached_tokens == 0 for o in [*off.outputs, off.whole])
    assert off.tokens == on.tokens
    np.testing.assert_array_equal(
        np.asarray(off.trajectory.routes().routes_TLK),
        np.asarray(on.trajectory.routes().routes_TLK),
    )
    np.testing.assert_array_equal(
        off.whole.outputs[0].routed_experts, on.whole.outputs[0].routed_experts
    )


def test_a_turn_that_does_not_extend_the_conversation_is_refused(engines) -> None:
    conv = _conversation(engines)
    ck = build_checkpoint(FAMILY)
    llm = engines.get(ck, FP32)
    trajectory = Trajectory(ck.route_meta(), num_prompt_tokens=FIRST_PROMPT)
    trajectory.add_vllm_output(conv.outputs[0], prompt_start=conv.starts[0])
    # a re-rendered history: one token of turn 1's completion changed
    edited = list(conv.prompts[1])
    at = FIRST_PROMPT + 1
    edited[at] = 3 + (edited[at] - 2) % (ck.vocab_size - 3)
    with pytest.raises(EngineOutputError, match=f"differ from token {at}"):
        trajectory.prompt_start(edited)
    out = _generate(llm, edited, _params(conv.starts[1], seed=101))
    with pytest.raises(EngineOutputError, match="does not extend"):
        trajectory.add_vllm_output(out, prompt_start=conv.starts[1])
    # an earlier turn's answer (a prompt shorter than the routed tokens) too
    trajectory.add_vllm_output(conv.outputs[1], prompt_start=conv.starts[1])
    with pytest.raises(EngineOutputError, match="does not extend"):
        trajectory.add_vllm_output(conv.outputs[0], prompt_start=conv.starts[0])
    assert trajectory.routed_tokens == len(conv.prompts[2]) - USER_TOKENS - 1


def test_the_stitched_routes_replay_in_transformers(engines) -> None:
    conv = _conversation(engines)
    ck = build_checkpoint(FAMILY)
    meta = ck.route_meta()
    batch = validate_samples([conv.trajectory.routes()], meta)
    model = trainer_model(ck)
    ids_1S = torch.tensor(conv.tokens)[None]
    mask_1S = torch.ones_like(ids_1S)
    rr_transformers.install()
    controller = _Watching(num_experts=ck.num_experts, top_k=ck.top_k)
    try:
        rr_transformers.attach(controller, model)
        controller.set_mode(ReplayMode.REPLAY)
        rr_transformers.arm_routes(controller, "turns", batch, attention_mask=mask_1S)
        with torch.no_grad(), controller.microbatch("turns"):
            model(input_ids=ids_1S, attention_mask=mask_1S, use_cache=False)
        report = controller.end_step()
    finally:
        controller.detach()
        rr_transformers.uninstall()
    values, valid = batch.sequence(0)
    rows = torch.nonzero(valid).flatten()
    mismatches = 0
    for n in ck.moe_layer_numbers:
        engine_RK = values[rows][:, n - 1].long().sort(-1).values
        used_RK = controller.used[n][rows].long().sort(-1).values
        mismatches += int((engine_RK != used_RK).any(-1).sum())
    assert rows.numel() == len(conv.tokens) - 1
    assert mismatches == 0
    assert sorted(report.agreement) == list(ck.moe_layer_numbers)
