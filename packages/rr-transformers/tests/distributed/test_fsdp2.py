"""R3 under FSDP2 on two gloo ranks: ``fully_shard`` on every decoder layer and the root,
transformers' non-reentrant activation checkpointing, each rank its own rollouts (emulated
engine with router noise, decoded through rr_vllm), one optimizer step.

Checked on both ranks: each layer's experts received exactly the armed sets on every replayed
row, in the forward and again in the recompute; the routers got (all-reduced) gradients and
moved; the loss is finite; and replay changed something (agreement < 1)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from _fsdp2_worker import fsdp2_r3_steps

from _helpers import FAMILIES
from rr_fakes.shims.megatron import launch

WORLD_SIZE = 2
MODEL_TYPES = tuple(f for f in ("qwen3_moe", "deepseek_v3") if f in FAMILIES)
TIMEOUT_S = 180  # hard limit for the launch; a loaded machine is slow, a hang is not


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, dict[str, Any]]]:
    """Both families' steps, in one launch (process start and imports dominate the time)."""
    return launch(fsdp2_r3_steps, WORLD_SIZE, MODEL_TYPES, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fsdp2_r3_replays_the_rollout_routes_exactly_on_every_rank(ranks, model_type):
    results = [by_family[model_type] for by_family in ranks]
    assert [r["rank"] for r in results] == list(range(WORLD_SIZE))
    assert results[0]["tokens"] != results[1]["tokens"]  # each rank trained on its own shard
    for result in results:
        assert result["layer_class"].startswith("FSDP")  # the layers really were sharded
        assert result["replayed_rows"] == result["rollout_rows"]
        for layer in result["layers"]:
            armed = result["armed"][layer]
            assert result["forward"][layer] == [armed], (result["rank"], layer)
            assert result["recompute"][layer] == [armed], (result["rank"], layer)
            assert result["router_grad"][layer] > 0.0
            assert result["router_moved"][layer]
        assert math.isfinite(result["loss"])
        assert result["loss"] > 0.0
        assert min(result["agreement"].values()) < 1.0  # the engine routed differently
    # FSDP2 reduced the gradients across the ranks: every rank holds the same full gradient
    assert results[0]["router_grad"] == results[1]["router_grad"]
