"""R2 in TRL's GRPOTrainer: ``use_vllm=False`` (TRL generates with the trainer's own model).
rr records each rollout row's routes in the rows' first forward (TRL's old-log-prob forward
when it runs one, else a forward of rr's own) and every training forward of those rows replays
them, after TRL's shuffle, split and buffering."""

from __future__ import annotations

from typing import Any

import grpo_runs
import pytest


@pytest.mark.parametrize(
    "steps_per_generation",
    [None, 2],
    ids=["on-policy: rr records", "buffered: TRL's old-log-prob forward records"],
)
def test_r2_replays_every_training_row(engines: Any, steps_per_generation: int | None) -> None:
    """``steps_per_generation=2``: one rollout of twice the rows, split over two steps (TRL
    then computes old log-probs: ``gradient_accumulation_steps % 2 != 0``)."""
    on = grpo_runs.run(engines, "qwen3_moe", "float32", replay=True, use_vllm=False,
                       steps_per_generation=steps_per_generation)  # fmt: skip
    grpo_runs.TABLE.append(on)
    assert len(on.steps) == grpo_runs.STEPS
    assert on.provenance is None  # no engine: the routes are the trainer's own
    grpo_runs.assert_replayed(on, whole_rows=True)
    # a step that trains on rows recorded with its own weights agrees fully; buffered, the
    # second step of a rollout trains on rows recorded before the first step's update (the
    # drift R2 replays away: its agreement may fall below 1, with 0 pairs differing)
    fresh = range(0, grpo_runs.STEPS, steps_per_generation or 1)
    assert all(on.steps[i].agreement == 1.0 for i in fresh), on.steps


def test_r2_with_replay_off_measures_the_same_rows(engines: Any) -> None:
    off = grpo_runs.run(engines, "qwen3_moe", "float32", replay=False, use_vllm=False, steps=1)
    grpo_runs.TABLE.append(off)
    assert off.steps[0].pairs == off.steps[0].tokens > 0  # routes recorded and carried
    assert off.steps[0].agreement != off.steps[0].agreement  # nan: nothing replayed
