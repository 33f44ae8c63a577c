"""G6: multi-turn trajectories gathered with a growing prompt_start (O(N) route transfer), and
the cached-prefix omission of vLLM RFC #56402, stitched and checked turn by turn.

The emulated engine routes every position the same way in every turn (the routes of a
position depend on its prefix only), so a stitched trajectory must equal those routes exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rr_fakes.emulations.engines import encode_npy_base64, era_of, vllm_request_output
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineOutputError,
    Trajectory,
    decode_vllm_output,
    npy_base64_to_array,
    omission_start,
)
from vllm_testing import distinct_routes, make_meta

META = make_meta(dense=(2,))


class Agent:
    """A conversation: each turn appends tool tokens, then the engine generates."""

    def __init__(self, prompt: int, seed: int = 0, total: int = 400) -> None:
        self.tokens = list(range(1, prompt + 1))
        self.true_routes = distinct_routes(META, total, seed=seed)  # position t's route
        self.sent_rows = 0

    def turn(
        self,
        version: str,
        trajectory: Trajectory,
        *,
        tool: int,
        generate: int,
        drop_last: bool = False,
        cached: int = 0,
        omit: bool = False,
        start: int | None = None,
    ) -> Any:
        if drop_last:
            self.tokens = self.tokens[:-1]
        self.tokens += list(range(1000 + len(self.tokens), 1000 + len(self.tokens) + tool))
        prompt = list(self.tokens)
        sent = trajectory.prompt_start(prompt) if start is None else start
        generated = list(range(5000 + len(prompt), 5000 + len(prompt) + generate))
        p, g = len(prompt), generate
        out = vllm_request_output(
            era_of(version),
            prompt_ids=prompt,
            generated_ids=generated,
            routes_TLK=self.true_routes[: p + g - 1],
            num_experts=8,
            prompt_start=sent,
            cached_prefix=cached,
            omit_cached_prefix=omit,
            engine_version=version,
        )
        self.sent_rows += out.outputs[0].routed_experts.shape[0]
        trajectory.add_vllm_output(out, prompt_start=sent)
        self.tokens = prompt + generated
        return out


def _check(agent: Agent, trajectory: Trajectory, extra: int = 0) -> None:
    t = len(agent.tokens)
    sample = trajectory.routes(t + extra)
    assert sample.routes_TLK.shape == (t + extra, 4, 2)
    np.testing.assert_array_equal(sample.valid_T, np.arange(t + extra) < t - 1)
    np.testing.assert_array_equal(sample.routes_TLK[: t - 1], agent.true_routes[: t - 1])
    assert not sample.routes_TLK[t - 1 :].any()
    assert trajectory.mismatched_rows == 0


@pytest.mark.parametrize("version", ["0.22.0", "0.28.0", "0.30.0", "0.33.0"])
def test_turns_transfer_each_row_once(version: str) -> None:
    agent, trajectory = Agent(12), Trajectory(META, num_prompt_tokens=12, vllm_version=version)
    for tool, gen in [(0, 5), (7, 3), (2, 9), (11, 1)]:
        agent.turn(version, trajectory, tool=tool, generate=gen)
    _check(agent, trajectory, extra=4)  # tool output after the last turn: invalid rows
    assert agent.sent_rows == len(agent.tokens) - 1  # O(N): no row sent twice
    assert trajectory.routes().num_prompt_tokens == 12


@pytest.mark.parametrize("version", ["0.14.0", "0.20.2"])
def test_turns_without_the_knob_resend_and_compare_the_prefix(version: str) -> None:
    agent, trajectory = Agent(6), Trajectory(META, num_prompt_tokens=6, vllm_version=version)
    for tool, gen in [(0, 4), (3, 2), (5, 3)]:
        agent.turn(version, trajectory, tool=tool, generate=gen)
    _check(agent, trajectory)
    assert agent.sent_rows > len(agent.tokens) - 1  # O(N^2) there, still exact


@pytest.mark.parametrize("version", ["0.28.0", "0.33.0"])
def test_a_prompt_of_exactly_the_routed_tokens(version: str) -> None:
    # the next prompt drops the last sampled token: prompt_start would be P (G4 on 0.28)
    agent, trajectory = Agent(8), Trajectory(META, num_prompt_tokens=8, vllm_version=version)
    agent.turn(version, trajectory, tool=0, generate=4)
    agent.turn(version, trajectory, tool=0, generate=3, drop_last=True)
    _check(agent, trajectory)


def test_cached_prefix_omission_rows_start_at_the_cache_hit() -> None:
    version = "0.33.0"
    trajectory = Trajectory(
        META, num_prompt_tokens=10, vllm_version=version, omit_cached_prefix=True, session_id="s1"
    )
    assert trajectory.headers == {"x-session-id": "s1"}
    agent = Agent(10)
    agent.turn(version, trajectory, tool=0, generate=6, omit=True)
    # a caller that sends prompt_start=0: the engine omits the 8 cached tokens' rows
    out = agent.turn(version, trajectory, tool=4, generate=3, omit=True, cached=8, start=0)
    assert out.outputs[0].routed_experts.shape[0] == len(agent.tokens) - 1 - 8
    assert omission_start(0, out.num_cached_tokens) == 8
    _check(agent, trajectory)


def test_omission_needs_a_session_id() -> None:
    with pytest.raises(CaptureError, match="x-session-id"):
        Trajectory(META, num_prompt_tokens=4, vllm_version="0.33.0", omit_cached_prefix=True)


def test_a_cache_hit_past_the_held_rows_is_a_gap() -> None:
    version = "0.33.0"
    trajectory = Trajectory(
        META, num_prompt_tokens=4, vllm_version=version, omit_cached_prefix=True, session_id="s"
    )
    agent = Agent(4)
    with pytest.raises(EngineOutputError, match="missing"):
        agent.turn(version, trajectory, tool=0, generate=3, omit=True, cached=3, start=0)


def test_a_prompt_that_does_not_extend_the_trajectory_is_refused() -> None:
    agent, trajectory = Agent(6), Trajectory(META, num_prompt_tokens=6, vllm_version="0.33.0")
    agent.turn("0.33.0", trajectory, tool=0, generate=3)
    with pytest.raises(EngineOutputError, match="differ from token 2"):
        trajectory.prompt_start([1, 2, 99, 4, 5, 6, 7, 8])


def test_rows_of_the_wrong_count_are_refused() -> None:
    agent, trajectory = Agent(6), Trajectory(META, num_prompt_tokens=6, vllm_version="0.33.0")
    agent.turn("0.33.0", trajectory, tool=0, generate=3)
    prompt = [*agent.tokens, 77]
    rows = agent.true_routes[7 : len(prompt) + 2 - 1]  # from token 7: one row too many
    with pytest.raises(EngineOutputError, match=r"expected \[3, 4, 2\]"):
        trajectory.add_turn(prompt, [1, 2], rows, prompt_start=trajectory.prompt_start(prompt))


@pytest.mark.parametrize("policy", ["count", "raise"])
def test_resent_rows_that_differ_are_counted_or_refused(policy: str) -> None:
    trajectory = Trajectory(
        META,
        num_prompt_tokens=5,
        vllm_version="0.20.2",
        on_mismatch=policy,  # type: ignore[arg-type]
    )
    agent = Agent(5)
    agent.turn("0.20.2", trajectory, tool=0, generate=3)
    agent.true_routes[2] = agent.true_routes[40]  # the engine now routes token 2 otherwise
    if policy == "raise":
        with pytest.raises(EngineOutputError, match="first at token 2"):
            agent.turn("0.20.2", trajectory, tool=2, generate=2)
        return
    agent.turn("0.20.2", trajectory, tool=2, generate=2)
    assert trajectory.mismatched_rows == 1


def test_aborted_or_missing_turns_are_refused() -> None:
    trajectory = Trajectory(META, num_prompt_tokens=3, vllm_version="0.33.0")
    with pytest.raises(EngineOutputError, match="aborted"):
        trajectory.add_turn([1, 2, 3], [4], None, prompt_start=0, finish_reason="abort")
    with pytest.raises(EngineOutputError, match="D3"):
        trajectory.add_turn([1, 2, 3], [4], None, prompt_start=0, finish_reason="stop")
    with pytest.raises(CaptureError, match="assemble_multi_turn"):
        Trajectory(META, num_prompt_tokens=3, vllm_version="0.21.0")


def test_http_choices_stitch_like_request_outputs() -> None:
    agent, trajectory = Agent(6), Trajectory(META, num_prompt_tokens=6, vllm_version="0.33.0")
    agent.turn("0.33.0", trajectory, tool=0, generate=3)
    prompt = [*agent.tokens, 61, 62]
    start = trajectory.prompt_start(prompt)
    p, g = len(prompt), 2
    wire = encode_npy_base64(agent.true_routes[start : p + g - 1].astype(np.uint8))
    trajectory.add_turn(prompt, [70, 71], npy_base64_to_array(wire), prompt_start=start)
    agent.tokens = [*prompt, 70, 71]
    _check(agent, trajectory)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(["0.22.0", "0.28.0", "0.33.0"]),
    prompt=st.integers(1, 10),
    turns=st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 6), st.booleans()), min_size=1, max_size=5
    ),
)
def test_any_conversation_stitches_to_the_engines_routes(
    version: str, prompt: int, turns: list[tuple[int, int, bool]]
) -> None:
    agent = Agent(prompt, total=prompt + 13 * len(turns))
    trajectory = Trajectory(META, num_prompt_tokens=prompt, vllm_version=version)
    for n, (tool, gen, drop) in enumerate(turns):
        agent.turn(version, trajectory, tool=tool, generate=gen, drop_last=drop and n > 0)
    _check(agent, trajectory)
    # and the whole trajectory sent once at prompt_start=0 decodes to the same sample
    full = vllm_request_output(
        era_of(version),
        prompt_ids=agent.tokens[:-1],
        generated_ids=agent.tokens[-1:],
        routes_TLK=agent.true_routes[: len(agent.tokens) - 1],
        num_experts=8,
    )
    (sample,) = decode_vllm_output(full, DecodeOptions(meta=META))
    assert sample is not None
    np.testing.assert_array_equal(trajectory.routes().routes_TLK, sample.routes_TLK)
