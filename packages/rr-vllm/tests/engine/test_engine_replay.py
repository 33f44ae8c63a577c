"""R3 on the real engine: rr_vllm decodes a vLLM rollout, rr_transformers replays it in the
same checkpoint loaded by transformers (float32 trainer), against a float32 and a bfloat16
engine.

What must hold, per family and engine dtype: under replay every (token, MoE layer) the engine
routed goes to the engine's experts (zero mismatches), in a padded batch and packed in one row
(the two give the same log-probs); on its own the trainer routes as a float32 engine does
(same weights, same arithmetic up to rounding) and somewhere differently from a bfloat16 one.
The figures (native agreement, log-prob gap of the sampled tokens without and with replay) are
printed in the terminal summary.
"""

from __future__ import annotations

import functools

import pytest
from engine_rollouts import (
    DTYPES,
    FIGURES,
    MLA_FAMILIES,
    ReplayFigures,
    expect_float32_routing,
    replay,
    rollout,
)

import rr_transformers
from rr_fakes.shims.hf_checkpoints import FAMILIES

KEYS = [(f, d) for d in DTYPES for f in FAMILIES]  # dtype-major: each engine starts once


@pytest.fixture(autouse=True)
def hooks():  # per test: the leak check fails a test that ends with rr's patches in place
    rr_transformers.install()
    yield
    rr_transformers.uninstall()


@functools.cache
def _figures(engines, family: str, dtype: str) -> ReplayFigures:
    figures = replay(rollout(engines, family, dtype))
    FIGURES.append(figures.row())
    return figures


@pytest.mark.parametrize(("family", "dtype"), KEYS)
def test_replay_sends_every_routed_token_to_the_engines_experts(
    engines, family: str, dtype: str
) -> None:
    figures = _figures(engines, family, dtype)
    assert figures.pairs > 0
    assert figures.replay_mismatches == 0
    assert figures.padded_vs_packed < 1e-4  # the packed replay is the padded one
    assert sorted(figures.per_layer_agreement) == list(
        rollout(engines, family, dtype).checkpoint.moe_layer_numbers
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_a_float32_engine_routes_as_the_trainer(engines, family: str) -> None:
    expect_float32_routing(_figures(engines, family, "float32"), family)


def test_a_bfloat16_engine_routes_differently_somewhere(engines) -> None:
    rows = [_figures(engines, f, "bfloat16") for f in FAMILIES if f not in MLA_FAMILIES]
    assert min(r.native_agreement for r in rows) < 1.0


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in MLA_FAMILIES])
def test_replay_brings_the_trainer_closer_where_routing_differed(engines, family: str) -> None:
    figures = _figures(engines, family, "bfloat16")
    there = figures.differs_G
    if not there.any():
        pytest.skip(f"{family}: the bfloat16 engine routed every sampled position as the trainer")
    assert figures.lp_gap_replay[there].mean() <= figures.lp_gap_native[there].mean()
