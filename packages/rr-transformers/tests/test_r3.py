"""R3 end to end on real tiny transformers models: an emulated rollout engine (noisy router
numerics) generates, its answer is decoded as vLLM (or SGLang) returns it by rr_vllm, and the
trainer's forward over the same tokens (left-padded, right-padded or packed) replays it.

What must hold: each MoE layer's experts receive the rollout's sets on every routed row (T-1 per
sequence); the last token of each sequence, padding and dense layers route natively (the ids the
router's own scores pick in that very forward); the trainer's native routing differs from the
engine's on some rows before replay.

Shapes: B sequences, S padded length, N tokens the routers see, L layer slots, K top-k.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import rr_transformers
import rr_vllm
from _helpers import FAMILIES, expert_inputs, routers, same_sets
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta, TopK
from rr_core.replay.topk import is_topk_set_T
from rr_fakes import RolloutEmulator
from rr_fakes.emulations.engines import VllmEra
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_model

pytestmark = pytest.mark.usefixtures("hooks")

NOISE = 0.05  # router-score noise of the emulated engine: a few rows in ten route differently
PROMPTS = (((5, 17, 33), 4), ((40, 8), 6), ((12, 60, 71, 23), 3))  # (prompt, max_new_tokens)
ERAS = (VllmEra.V0_32, VllmEra.V0_21, VllmEra.V0_14)  # newest, split arrays, first
LAYOUTS = ("left", "right", "packed")
PAD = 0


class _Watching(ReplayController):
    """A controller that also keeps, per router, the top-k of the scores it computed in the
    last forward: what that router would have chosen natively."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.native: dict[int, torch.Tensor] = {}
        self.scores: dict[int, torch.Tensor] = {}

    def route(
        self, router: nn.Module, scores_TE: torch.Tensor, k: int, *, values_TE: Any = None
    ) -> TopK:
        self.native[id(router)] = scores_TE.detach().topk(k).indices
        self.scores[id(router)] = scores_TE.detach()
        return super().route(router, scores_TE, k, values_TE=values_TE)


def _attach_for_rollout(controller: ReplayController, model: nn.Module) -> tuple[int, ...]:
    return rr_transformers.attach(controller, model).layer_numbers


def _logits(model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids_1S).logits


@functools.cache
def _rollouts(model_type: str) -> tuple[nn.Module, tuple[Any, ...]]:
    """A tiny model and three sampled rollouts of it through the noisy engine (built once per
    family; the tests never change the model)."""
    model = tiny_model(model_type)
    emulator = RolloutEmulator(
        model,
        NUM_EXPERTS,
        TOP_K,
        num_layers=len(rr_transformers.decoder_layers(model)),
        noise=NOISE,
        seed=3,
        attach=_attach_for_rollout,
        forward=_logits,
    )
    rollouts = tuple(emulator.generate(p, max_new_tokens=g, temperature=1.0) for p, g in PROMPTS)
    return model, rollouts


def _meta(model: nn.Module, moe_layers: Sequence[int]) -> RouteMeta:
    """What the trainer knows of its model: the all-layers axis and which layers are MoE."""
    num_layers = len(rr_transformers.decoder_layers(model))
    return RouteMeta(
        num_experts=NUM_EXPERTS,
        top_k=TOP_K,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, num_layers + 1)),
        moe_layer_numbers=tuple(moe_layers),
    )


def _t_minus_1(batch: RouteBatch) -> RouteBatch:
    """The batch with each sequence's last row dropped: the T-1 rows the engine captured."""
    parts = [batch.sequence(b) for b in range(batch.num_sequences)]
    return RouteBatch.from_sequences(
        [v[:-1] for v, _ in parts], batch.meta, valid=[m[:-1] for _, m in parts]
    )


def _layout(
    rollouts: Sequence[Any], layout: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[list[int]], int]:
    """Model inputs, the arm_routes layout argument, each sequence's token positions in the
    routers' order (B*S rows, row-major), and N."""
    tokens = [torch.tensor(r.token_ids) for r in rollouts]
    if layout == "packed":
        ids_1N = torch.cat(tokens)[None]
        pos_1N = torch.cat([torch.arange(t.numel()) for t in tokens])[None]
        starts = np.cumsum([0] + [t.numel() for t in tokens])
        where = [list(range(a, b)) for a, b in itertools.pairwise(starts)]
        return (
            {"input_ids": ids_1N, "position_ids": pos_1N},
            {"position_ids": pos_1N},
            where,
            ids_1N.numel(),
        )
    S = max(t.numel() for t in tokens) + 1  # every sequence has padding
    ids_BS = torch.full((len(tokens), S), PAD)
    mask_BS = torch.zeros(len(tokens), S, dtype=torch.int64)
    where = []
    for b, t in enumerate(tokens):
        at = range(S - t.numel(), S) if layout == "left" else range(t.numel())
        ids_BS[b, list(at)] = t
        mask_BS[b, list(at)] = 1
        where.append([b * S + s for s in at])
    return (
        {"input_ids": ids_BS, "attention_mask": mask_BS},
        {"attention_mask": mask_BS},
        where,
        ids_BS.numel(),
    )


def _rollout_rows(rollouts: Sequence[Any], where: list[list[int]], slot: int):
    """Token positions that carry a rollout route (all but each sequence's last token) and the
    rollout's ids there, ``[R]`` and ``[R, K]``."""
    rows = [pos for positions in where for pos in positions[:-1]]
    ids_RK = np.concatenate([r.routes_TLK[:, slot] for r in rollouts])
    return torch.tensor(rows), torch.from_numpy(ids_RK)


def _check_replay(
    model: nn.Module, rollouts: Sequence[Any], batch: RouteBatch, layout: str
) -> None:
    controller = _Watching(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    inputs, arm_kw, where, n = _layout(rollouts, layout)
    try:
        assert attachment.layer_numbers == rollouts[0].moe_layer_numbers
        assert batch.meta.moe_layer_numbers in (attachment.layer_numbers, None)
        # The trainer's own routing of the same tokens, before replay.
        controller.set_mode(ReplayMode.RECORD)
        with torch.no_grad(), controller.microbatch("native"):
            model(**inputs)
        native_NMK = controller.recorded("native")
        controller.end_step()
        # R3: the rollout's routes, laid out as the routers see the batch.
        controller.set_mode(ReplayMode.REPLAY)
        rr_transformers.arm_routes(controller, "r3", batch, **arm_kw)
        with expert_inputs(model) as seen, controller.microbatch("r3"):
            logits = model(**inputs).logits
        logits.float().square().mean().backward()
        report = controller.end_step()
        by_layer = routers(model, attachment.family)
        native = {layer: controller.native[id(r)] for layer, r in by_layer.items()}
        scores = {layer: controller.scores[id(r)] for layer, r in by_layer.items()}
        grads = {layer: r.weight.grad for layer, r in by_layer.items()}
    finally:
        controller.detach()
        model.zero_grad(set_to_none=True)

    assert sorted(seen) == list(attachment.layer_numbers)  # dense layers have no experts
    before = []
    for m, layer in enumerate(attachment.layer_numbers):
        rows_R, rollout_RK = _rollout_rows(rollouts, where, layer - 1)
        ((ids_NK, _),) = seen[layer]
        assert ids_NK.shape == (n, TOP_K)
        assert same_sets(ids_NK[rows_R], rollout_RK), f"layer {layer}: replay missed a row"
        others_N = torch.ones(n, dtype=torch.bool)
        others_N[rows_R] = False  # each sequence's last token, and padding
        assert int(others_N.sum()) == n - sum(len(p) - 1 for p in where)
        # Natively routed: a top-k set of the row's scores, torch.topk's own set where no expert
        # ties the k-th score (with ties, rr's compiled pass ranks the lower id first, which
        # torch.topk leaves open: a padding row's zero input ties every expert)
        assert is_topk_set_T(scores[layer][others_N], ids_NK[others_N]).all(), f"layer {layer}"
        top_NK1 = scores[layer].topk(TOP_K + 1).values
        untied_N = others_N & (top_NK1[:, TOP_K - 1] > top_NK1[:, TOP_K])
        assert same_sets(ids_NK[untied_N], native[layer][untied_N]), f"layer {layer}"
        same_R = (
            native_NMK[rows_R, m].long().sort(-1).values == rollout_RK.long().sort(-1).values
        ).all(-1)
        before.append(same_R.float().mean().item())
    assert min(before) < 1.0, f"the engine routed like the trainer ({before}); raise NOISE"
    assert sorted(report.agreement) == list(attachment.layer_numbers)
    assert min(report.agreement.values()) < 1.0  # replay changed some rows' experts
    assert torch.isfinite(logits).all()
    for layer, grad in grads.items():  # gate weights come from the trainer's router scores
        assert grad is not None, f"layer {layer}: no gradient"
        assert bool(grad.abs().sum() > 0), f"layer {layer}: zero gradient"


def _decoded(model: nn.Module, rollouts: Sequence[Any], era: VllmEra) -> RouteBatch:
    meta = _meta(model, rollouts[0].moe_layer_numbers)
    options = rr_vllm.DecodeOptions(meta=meta)
    batch = rr_vllm.decode_vllm_output([r.vllm_output(era) for r in rollouts], options).to_batch()
    for b, r in enumerate(rollouts):
        values_TLK, valid_T = batch.sequence(b)
        T = len(r.token_ids)
        assert values_TLK.shape[0] in (T, T - 1)
        assert torch.equal(values_TLK[: T - 1].long(), torch.from_numpy(r.routes_TLK))
        assert bool(valid_T[: T - 1].all())
        assert not bool(valid_T[T - 1 :].any())  # rr_vllm's padding row, if any
    return batch


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_r3_replays_the_vllm_rollout(model_type, era, layout):
    model, rollouts = _rollouts(model_type)
    _check_replay(model, rollouts, _decoded(model, rollouts, era), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_r3_with_t_minus_1_rows_per_sequence(model_type, layout):
    """The engine's T-1 rows, without the padding row rr_vllm adds: the same replay."""
    model, rollouts = _rollouts(model_type)
    batch = _t_minus_1(_decoded(model, rollouts, ERAS[0]))
    assert batch.lengths.tolist() == [len(r.token_ids) - 1 for r in rollouts]
    _check_replay(model, rollouts, batch, layout)


def test_per_request_decoding_gives_the_batch_decoding():
    """Each request decoded on its own and its samples batched give the rollout's one-copy batch
    (decode_vllm_output of every request, to_batch()) for every era."""
    model, rollouts = _rollouts("qwen3_moe")
    options = rr_vllm.DecodeOptions(meta=_meta(model, rollouts[0].moe_layer_numbers))
    for era in VllmEra:
        outputs = [r.vllm_output(era) for r in rollouts]
        samples = [s for o in outputs for s in rr_vllm.decode_vllm_output(o, options)]
        assert rr_vllm.validate_samples(samples, options.meta).equal(
            rr_vllm.decode_vllm_output(outputs, options).to_batch()
        )


@pytest.mark.parametrize("layout", ["left", "packed"])
def test_r3_replays_an_sglang_rollout(layout):
    model, rollouts = _rollouts("deepseek_v3")
    options = rr_vllm.DecodeOptions(meta=_meta(model, rollouts[0].moe_layer_numbers))
    routes = [rr_vllm.decode_sglang(r.sglang_output(), options) for r in rollouts]
    batch = sum(routes[1:], routes[0]).to_batch()  # one rollout, answers decoded apart
    assert torch.equal(batch.values_NLK, _decoded(model, rollouts, ERAS[0]).values_NLK)
    _check_replay(model, rollouts, batch, layout)
