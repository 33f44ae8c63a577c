"""R3 on the real engine into Megatron: rr_vllm decodes a vLLM rollout, and the same checkpoint,
loaded into a real megatron-core GPTModel by ``rr_fakes.megatron.hf_loader`` (float32), replays
it through rr's public API (``rr_megatron_compat``: install, attach, ``batch_to_router_rows``,
the controller armed with a replay mask), against a float32 and a bfloat16 engine.

What must hold, per family and engine dtype: under replay every (token, MoE layer) the engine
routed goes to the engine's experts in every router (zero mismatches, read from the routers'
routing maps); natively the GPTModel routes as a float32 engine does; where a bfloat16 engine
routed a sampled position differently, replay brings the trainer's log-prob of that token no
further from the engine's. The figures (native agreement, the controller's measured
agreement, the sampled-token log-prob gap without and with replay) are printed at the end of
the module ("vLLM engine vs Megatron trainer") and written as JSON to
``$RR_ENGINE_MEGATRON_REPORT`` when it is set.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("rr_megatron_compat", reason="rr-megatron-compat is not installed")

from rr_fakes.megatron import unavailable_reason

if unavailable_reason():
    pytest.skip(f"megatron-core does not run here: {unavailable_reason()}", allow_module_level=True)

from engine_rollouts import (
    DTYPES,
    MLA_FAMILIES,
    Figures,
    Rollout,
    gap_row,
    report_figures,
    rollout,
)

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayMode
from rr_fakes.megatron import map_ids, model_parallel, route_log
from rr_fakes.megatron.hf_loader import HF_LOADER_FAMILIES, build_hf_gpt

KEYS = [(f, d) for d in DTYPES for f in HF_LOADER_FAMILIES]  # dtype-major: each engine once
ROWS: list[dict[str, Any]] = []


@dataclass
class MegatronFigures(Figures):
    """The GPTModel (float32) against one engine rollout, over the engine's routed rows."""

    replay_mismatches_per_layer: dict[int, int]
    lp_gap_native: np.ndarray  # |log p GPTModel - log p engine| per sampled token
    lp_gap_replay: np.ndarray
    differs_G: np.ndarray  # sampled tokens whose prediction row routed differently natively
    # per layer, the controller's agreement measured in the replayed forward (its upstream
    # layers already follow the engine, so it is not the native agreement)
    controller_agreement: dict[int, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {
            **self.head_row(),
            "controller agreement": round(
                float(np.mean(list(self.controller_agreement.values()))), 4
            ),
            "mismatches with replay": sum(self.replay_mismatches_per_layer.values()),
            **gap_row(self.lp_gap_native, self.lp_gap_replay, self.differs_G),
        }


def _forward(
    model: Any, controller: ReplayController, ids_BS: torch.Tensor
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Logits ``[B, S, V]`` and, per MoE layer, the expert ids ``[B, S, K]`` its router sent
    each token to (ascending)."""
    B, S = ids_BS.shape
    with torch.no_grad(), route_log(model) as log:
        logits = model(ids_BS, torch.arange(S).expand(B, S), attention_mask=None)
    used = {
        layer: map_ids(maps[-1]).view(S, B, -1).transpose(0, 1)  # router rows are [S, B]
        for layer, maps in log.forward.items()
    }
    return logits, used


def megatron_replay(roll: Rollout) -> MegatronFigures:
    ck = roll.checkpoint
    batch = roll.batch()
    meta = batch.meta
    seqs = roll.sequences()
    tokens = [p + g for p, g, _ in seqs]
    S = max(len(t) for t in tokens)
    ids_BS = torch.zeros(len(tokens), S, dtype=torch.int64)
    for b, t in enumerate(tokens):
        ids_BS[b, : len(t)] = torch.tensor(t)
    routes_BSLK, valid_BS = batch.to_padded("right", length=S)
    with model_parallel():
        rmc.install()
        try:
            model, spec = build_hf_gpt(ck.path, extra=rmc.replay_config_fields())
            assert spec.moe_layer_numbers == ck.moe_layer_numbers
            controller = ReplayController(num_experts=ck.num_experts, top_k=ck.top_k)
            assert rmc.attach(controller, model).layer_numbers == ck.moe_layer_numbers
            try:
                logits_native, native = _forward(model, controller, ids_BS)
                controller.end_step()
                controller.set_mode(ReplayMode.REPLAY)
                controller.arm(
                    0,
                    rmc.batch_to_router_rows(routes_BSLK),
                    layer_numbers=meta.layer_numbers,
                    replay_mask_T=valid_BS.transpose(0, 1).reshape(-1),
                )
                logits_replay, replayed = _forward(model, controller, ids_BS)
                report = controller.end_step()
            finally:
                controller.detach()
        finally:
            rmc.uninstall()

    valid = valid_BS.bool()
    pairs = native_mm = 0
    replay_mm = dict.fromkeys(ck.moe_layer_numbers, 0)
    for n in ck.moe_layer_numbers:
        engine_BSK = routes_BSLK[:, :, n - 1].long().sort(-1).values
        native_diff_BS = (native[n] != engine_BSK).any(-1) & valid
        pairs += int(valid.sum())
        native_mm += int(native_diff_BS.sum())
        replay_mm[n] = int(((replayed[n] != engine_BSK).any(-1) & valid).sum())
    differs_BS = torch.zeros_like(valid)
    for n in ck.moe_layer_numbers:
        engine_BSK = routes_BSLK[:, :, n - 1].long().sort(-1).values
        differs_BS |= (native[n] != engine_BSK).any(-1) & valid
    lp_native = torch.log_softmax(logits_native.float(), -1)
    lp_replay = torch.log_softmax(logits_replay.float(), -1)
    gap_native, gap_replay, differs = [], [], []
    for b, (prompt, generated, completion) in enumerate(seqs):
        at = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(generated))
        tok = torch.tensor(generated)
        engine = np.array([completion.logprobs[g][t].logprob for g, t in enumerate(generated)])
        gap_native.append(np.abs(lp_native[b, at, tok].numpy() - engine))
        gap_replay.append(np.abs(lp_replay[b, at, tok].numpy() - engine))
        differs.append(differs_BS[b, at].numpy())
    return MegatronFigures(
        family=roll.family,
        dtype=roll.dtype,
        pairs=pairs,
        native_mismatches=native_mm,
        replay_mismatches_per_layer=replay_mm,
        lp_gap_native=np.concatenate(gap_native),
        lp_gap_replay=np.concatenate(gap_replay),
        differs_G=np.concatenate(differs),
        controller_agreement=dict(report.agreement),
    )


class _Summary:
    """Prints :data:`ROWS` in the terminal summary (a test module cannot define the hook
    itself; the engine folder's conftest prints the transformers table)."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        report_figures(
            terminalreporter,
            "vLLM engine vs Megatron trainer (float32 GPTModel)",
            ROWS,
            "RR_ENGINE_MEGATRON_REPORT",
        )


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> None:
    manager = request.config.pluginmanager
    if not manager.has_plugin("rr-engine-megatron-summary"):
        manager.register(_Summary(), "rr-engine-megatron-summary")


@functools.cache
def _figures(engines: Any, family: str, dtype: str) -> MegatronFigures:
    figures = megatron_replay(rollout(engines, family, dtype))
    ROWS.append(figures.row())
    return figures


@pytest.mark.parametrize(("family", "dtype"), KEYS)
def test_megatron_replay_sends_every_routed_token_to_the_engines_experts(
    engines: Any, family: str, dtype: str
) -> None:
    figures = _figures(engines, family, dtype)
    assert figures.pairs > 0
    assert figures.replay_mismatches_per_layer == dict.fromkeys(
        rollout(engines, family, dtype).checkpoint.moe_layer_numbers, 0
    )
    assert sorted(figures.controller_agreement) == sorted(figures.replay_mismatches_per_layer)


@pytest.mark.parametrize("family", HF_LOADER_FAMILIES)
def test_a_float32_engine_routes_as_the_gpt_model(engines: Any, family: str) -> None:
    figures = _figures(engines, family, "float32")
    if family in MLA_FAMILIES and figures.native_agreement < 0.99:
        pytest.xfail(
            "vLLM 0.30's CPU MLA attention computes another model than the checkpoint's "
            f"DeepSeek-V3 (native agreement {figures.native_agreement:.3f}; transformers' own "
            "model and the GPTModel agree with each other)"
        )
    assert figures.native_agreement >= 0.99
    assert float(np.median(figures.lp_gap_native)) < 1e-3


@pytest.mark.parametrize("family", [f for f in HF_LOADER_FAMILIES if f not in MLA_FAMILIES])
def test_megatron_replay_brings_the_trainer_closer_where_routing_differed(
    engines: Any, family: str
) -> None:
    figures = _figures(engines, family, "bfloat16")
    there = figures.differs_G
    if not there.any():
        pytest.skip(f"{family}: the bfloat16 engine routed every sampled position as Megatron")
    assert figures.lp_gap_replay[there].mean() <= figures.lp_gap_native[there].mean()
