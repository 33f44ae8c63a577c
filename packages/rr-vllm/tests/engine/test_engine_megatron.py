"""R3 on the real engine into Megatron: rr_vllm decodes a vLLM rollout, and the same checkpoint,
loaded into a real megatron-core GPTModel by ``rr_fakes.hf_to_megatron`` (float32), replays
it through rr's public API (``rr_megatron_compat``: install, attach, ``batch_to_router_rows``,
the controller armed with a replay mask), against a float32 and a bfloat16 engine.

What must hold, per family and engine dtype: under replay every (token, MoE layer) the engine
routed goes to the engine's experts in every router (zero mismatches, read from the routers'
routing maps); natively the GPTModel routes as a float32 engine does; where a bfloat16 engine
routed a sampled position differently, replay brings the trainer's log-prob of that token no
further from the engine's. The replay and its figures: ``engine_megatron``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("rr_megatron_compat", reason="rr-megatron-compat is not installed")

from rr_fakes.shims.megatron import unavailable_reason

if unavailable_reason():
    pytest.skip(f"megatron-core does not run here: {unavailable_reason()}", allow_module_level=True)

from engine_megatron import MegatronFigures, expect_exact_replay, register_summary
from engine_megatron import figures as megatron_figures
from engine_rollouts import DTYPES, MLA_FAMILIES, expect_float32_routing, rollout

from rr_fakes.hf_to_megatron import HF_LOADER_FAMILIES

KEYS = [(f, d) for d in DTYPES for f in HF_LOADER_FAMILIES]  # dtype-major: each engine once


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> None:
    register_summary(request)


def _figures(engines: Any, family: str, dtype: str) -> MegatronFigures:
    return megatron_figures(engines, family, dtype, "rr loader")


@pytest.mark.parametrize(("family", "dtype"), KEYS)
def test_megatron_replay_sends_every_routed_token_to_the_engines_experts(
    engines: Any, family: str, dtype: str
) -> None:
    expect_exact_replay(
        _figures(engines, family, dtype), rollout(engines, family, dtype).checkpoint
    )


@pytest.mark.parametrize("family", HF_LOADER_FAMILIES)
def test_a_float32_engine_routes_as_the_gpt_model(engines: Any, family: str) -> None:
    expect_float32_routing(_figures(engines, family, "float32"), family)


@pytest.mark.parametrize("family", [f for f in HF_LOADER_FAMILIES if f not in MLA_FAMILIES])
def test_megatron_replay_brings_the_trainer_closer_where_routing_differed(
    engines: Any, family: str
) -> None:
    figures = _figures(engines, family, "bfloat16")
    there = figures.differs_G
    if not there.any():
        pytest.skip(f"{family}: the bfloat16 engine routed every sampled position as Megatron")
    assert figures.lp_gap_replay[there].mean() <= figures.lp_gap_native[there].mean()
