"""R3 on the real engine into Megatron, shared by the GPTModel that ``rr_fakes.hf_to_megatron``
loads and the one Megatron-Bridge converts: rr_vllm decodes a vLLM rollout, and the same
checkpoint as a float32 megatron-core GPTModel replays it through rr's public API
(``rr_megatron_compat``: install, attach, ``batch_to_router_rows``, the controller armed with a
replay mask). The figures (native agreement, the controller's measured agreement, the sampled-
token log-prob gap without and with replay) are printed at the end of the session ("vLLM engine
vs Megatron trainer") and written as JSON to ``$RR_ENGINE_MEGATRON_REPORT`` when it is set.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from engine_rollouts import (
    Engines,
    Figures,
    Rollout,
    engine_logprobs,
    gap_row,
    report_figures,
    rollout,
)

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.hf_checkpoints import HFCheckpoint
from rr_fakes.shims.megatron import map_ids, model_parallel, route_log

#: A GPTModel of a checkpoint, built with the given TransformerConfig fields (replay's).
Build = Callable[[HFCheckpoint, Mapping[str, Any]], Any]
ROWS: list[dict[str, Any]] = []


def rr_loader(checkpoint: HFCheckpoint, fields: Mapping[str, Any]) -> Any:
    """The GPTModel ``rr_fakes.hf_to_megatron`` loads."""
    from rr_fakes.hf_to_megatron import build_hf_gpt

    model, spec = build_hf_gpt(checkpoint.path, extra=fields)
    assert spec.moe_layer_numbers == checkpoint.moe_layer_numbers
    return model


def bridge(checkpoint: HFCheckpoint, fields: Mapping[str, Any]) -> Any:
    """The GPTModel Megatron-Bridge converts the checkpoint into (its conversion of the
    family, ``rr_fakes.hf_to_megatron``)."""
    from rr_fakes.hf_to_megatron import BRIDGE_FAMILIES, convert_hf_checkpoint
    from rr_fakes.shims.megatron.bridge_shims import bridge_cpu

    with bridge_cpu():
        return convert_hf_checkpoint(checkpoint.path, BRIDGE_FAMILIES[checkpoint.family], fields)


BUILDS: dict[str, Build] = {"rr loader": rr_loader, "bridge": bridge}


def figures(
    engines: Engines, family: str, dtype: str, build: str, variant: str = "{}"
) -> MegatronFigures:
    """:func:`megatron_replay` of the rollout of ``family`` (the checkpoint with the config
    fields ``variant``, JSON) on a ``dtype`` engine, through the GPTModel ``BUILDS[build]``
    makes; once per session, its row added to :data:`ROWS`."""
    return _figures(engines, family, dtype, build, variant)  # one cache key however called


@functools.cache
def _figures(
    engines: Engines, family: str, dtype: str, build: str, variant: str
) -> MegatronFigures:
    roll = rollout(engines, family, dtype, variant=json.loads(variant))
    result = megatron_replay(roll, BUILDS[build], build)
    result.variant = "" if variant == "{}" else variant
    ROWS.append(result.row())
    return result


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
    converter: str = "rr loader"
    variant: str = ""  # the checkpoint's config fields other than the family's default
    native_ids: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, S, K] per layer
    logits_native: torch.Tensor | None = None  # [B, S, V]

    def row(self) -> dict[str, Any]:
        head = self.head_row()
        return {
            "family": f"{head.pop('family')} {self.variant}".strip(),
            "GPTModel": self.converter,
            **head,
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


def megatron_replay(roll: Rollout, build: Build, converter: str) -> MegatronFigures:
    """The rollout's tokens through the GPTModel ``build`` makes of its checkpoint (given the
    replay's config fields), natively then under R3 replay of the engine's routes."""
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
            model = build(ck, rmc.replay_config_fields())
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
        engine = engine_logprobs(completion, generated)
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
        converter=converter,
        native_ids=native,
        logits_native=logits_native,
    )


def expect_exact_replay(figures: MegatronFigures, checkpoint: Any) -> None:
    """Under replay every (token, MoE layer) the engine routed went to the engine's experts,
    on every MoE layer of ``checkpoint``, and the controller measured each of them."""
    assert figures.pairs > 0
    assert figures.replay_mismatches_per_layer == dict.fromkeys(checkpoint.moe_layer_numbers, 0)
    assert sorted(figures.controller_agreement) == sorted(figures.replay_mismatches_per_layer)


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


def register_summary(request: pytest.FixtureRequest) -> None:
    """Print :data:`ROWS` at the end of the session (once, whichever module asks first)."""
    manager = request.config.pluginmanager
    if not manager.has_plugin("rr-engine-megatron-summary"):
        manager.register(_Summary(), "rr-engine-megatron-summary")
