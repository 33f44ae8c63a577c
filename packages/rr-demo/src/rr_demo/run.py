"""The main job end to end on CPU: roll out with an emulated engine, capture routes as vLLM
returns them, decode, compress and store them, then run the real Megatron trainer without and
with R3 replay and measure what changed.

Shapes: B sequences, S padded length, T tokens, L layer slots (all layers), M MoE layers,
K top-k, E experts, V vocabulary.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rr_core import (
    CODECS,
    ReplayController,
    ReplayMode,
    RouteMeta,
    encode_routes,
    load_routes,
    save_routes,
)
from rr_fakes import Rollout, RolloutEmulator
from rr_fakes.engines import VllmEra
from rr_fakes.megatron import RECOMPUTE, route_log, train_step


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """A small MoE: dense first layer, 16 experts, top-4; a batch of sampled rollouts."""

    num_layers: int = 6
    num_experts: int = 16
    top_k: int = 4
    hidden_size: int = 64
    vocab_size: int = 128
    batch: int = 8
    prompt_length: int = 10
    new_tokens: int = 12
    noise: float = 0.006  # std of the engine's router-score perturbation (kernel numerics)
    seed: int = 7

    @property
    def moe_layer_freq(self) -> list[int]:
        return [0] + [1] * (self.num_layers - 1)


@dataclass
class DemoResult:
    """The figures the demo reports (``--json`` prints them)."""

    megatron_core_version: str
    vllm_objects: str
    mismatch_without_replay: float
    mismatch_with_replay: float
    kl_without_replay: float
    kl_with_replay: float
    logprob_abs_diff_without_replay: float
    logprob_abs_diff_with_replay: float
    bytes_per_token: dict[str, float]
    record_file_bytes: int
    train_loss_with_replay: float
    layers: list[int] = field(default_factory=list)
    mismatch_per_layer_without_replay: list[float] = field(default_factory=list)
    mismatch_per_layer_with_replay: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _logits(model: nn.Module, ids_BS: torch.Tensor) -> torch.Tensor:
    positions_BS = torch.arange(ids_BS.shape[1]).expand_as(ids_BS)
    out: torch.Tensor = model(ids_BS, positions_BS, attention_mask=None)
    return out  # [B, S, V]


def _rollouts(model: nn.Module, cfg: DemoConfig) -> tuple[list[Rollout], list[torch.Tensor]]:
    """Sampled continuations with noisy routing, and the engine's log-prob of each new token."""
    steps: list[torch.Tensor] = []

    def engine_forward(m: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        logits = _logits(m, ids_1S)
        steps.append(torch.log_softmax(logits[0, -1].float(), dim=-1))
        return logits

    emulator = RolloutEmulator(
        model, cfg.num_experts, cfg.top_k, noise=cfg.noise, seed=cfg.seed, forward=engine_forward
    )
    g = torch.Generator().manual_seed(cfg.seed)
    rollouts, logprobs = [], []
    for _ in range(cfg.batch):
        prompt = torch.randint(0, cfg.vocab_size, (cfg.prompt_length,), generator=g).tolist()
        steps.clear()
        rollout = emulator.generate(prompt, max_new_tokens=cfg.new_tokens, temperature=1.0)
        new = torch.tensor(rollout.generated_ids)
        logprobs.append(torch.stack(steps)[torch.arange(len(new)), new])
        rollouts.append(rollout)
    return rollouts, logprobs


def _mismatch(
    maps: dict[int, list[torch.Tensor]], target_BSMK: torch.Tensor, valid_BS: torch.Tensor
) -> list[float]:
    """Per MoE layer: share of valid (token, layer) rows whose expert set differs, in the last
    forward's routing map ``[S * B, E]`` of each decoder router."""
    B, S = valid_BS.shape
    shares = []
    for m, layer in enumerate(sorted(maps)):
        used_BSE = maps[layer][-1].reshape(S, B, -1).transpose(0, 1)  # router rows are [S, B]
        want_BSE = torch.zeros_like(used_BSE).scatter(2, target_BSMK[:, :, m].long(), True)
        differs_BS = (used_BSE != want_BSE).any(dim=-1) & valid_BS
        shares.append(float(differs_BS.sum()) / max(1, int(valid_BS.sum())))
    return shares


def _kl_k3(train_N: torch.Tensor, rollout_N: torch.Tensor) -> tuple[float, float]:
    """Mean |delta log p| and the k3 estimate of KL(rollout || trainer) on rollout samples."""
    log_ratio = train_N - rollout_N
    k3 = torch.expm1(log_ratio) - log_ratio
    return float(log_ratio.abs().mean()), float(k3.mean())


def run_demo(
    cfg: DemoConfig = DemoConfig(), *, progress: Callable[[str], None] = lambda stage: None
) -> DemoResult:
    """Every stage of the demo; ``progress`` is called with each stage's name as it starts."""
    import rr_megatron_compat as rmc
    from rr_fakes.megatron import TinyGPTConfig, build_gpt, model_parallel
    from rr_vllm import decode_vllm_output, validate_samples

    start = time.perf_counter()
    with model_parallel(seed=cfg.seed):
        rmc.install()
        try:
            progress("build a real Megatron GPTModel")
            extra = {**RECOMPUTE, **rmc.replay_config_fields()}
            model = build_gpt(
                TinyGPTConfig(
                    num_layers=cfg.num_layers,
                    hidden_size=cfg.hidden_size,
                    num_attention_heads=4,
                    ffn_hidden_size=2 * cfg.hidden_size,
                    num_experts=cfg.num_experts,
                    top_k=cfg.top_k,
                    moe_layer_freq=cfg.moe_layer_freq,
                    vocab_size=cfg.vocab_size,
                    max_sequence_length=cfg.prompt_length + cfg.new_tokens + 1,
                    extra=extra,
                )
            )
            model.eval()
            progress("roll out with an emulated engine (noisy router numerics)")
            rollouts, engine_logprobs = _rollouts(model, cfg)
            progress("capture routes as vLLM 0.33 returns them, decode and validate")
            layers = tuple(range(1, cfg.num_layers + 1))
            meta = RouteMeta(
                num_experts=cfg.num_experts,
                top_k=cfg.top_k,
                layer_axis="all_layers",
                layer_numbers=layers,
                moe_layer_numbers=layers[1:],
            )
            outputs = [r.vllm_output(VllmEra.V0_32) for r in rollouts]
            samples = [s for out in outputs for s in decode_vllm_output(out, meta)]
            batch = validate_samples(samples, meta)
            progress("encode with each codec, write and re-read a record file")
            sizes: dict[str, float] = {c: _bytes_per_token(batch, c) for c in CODECS}
            with tempfile.TemporaryDirectory() as tmp:
                path = save_routes(Path(tmp) / "rollout.rr", batch, codec="packed")
                file_bytes = path.stat().st_size
                if not load_routes(path).equal(batch):
                    raise AssertionError("a record file did not round-trip")
            progress("trainer forward without and with R3 replay")
            forward = _trainer_forward(model, rollouts, batch, cfg)
            without, with_replay = forward(replay=False), forward(replay=True)
            progress("training step under replay (forward + backward, activation recompute)")
            loss = _train_step(model, rollouts, batch, cfg)
        finally:
            rmc.uninstall()
    rollout_N = torch.cat(engine_logprobs)
    abs_without, kl_without = _kl_k3(without.logprobs_N, rollout_N)
    abs_with, kl_with = _kl_k3(with_replay.logprobs_N, rollout_N)
    return DemoResult(
        megatron_core_version=_mcore_version(),
        vllm_objects=type(outputs[0]).__module__,
        mismatch_without_replay=without.mismatch,
        mismatch_with_replay=with_replay.mismatch,
        kl_without_replay=kl_without,
        kl_with_replay=kl_with,
        logprob_abs_diff_without_replay=abs_without,
        logprob_abs_diff_with_replay=abs_with,
        bytes_per_token=sizes,
        record_file_bytes=file_bytes,
        train_loss_with_replay=loss,
        layers=list(layers[1:]),
        mismatch_per_layer_without_replay=without.per_layer,
        mismatch_per_layer_with_replay=with_replay.per_layer,
        seconds=time.perf_counter() - start,
    )


def _mcore_version() -> str:
    from importlib.metadata import version

    return version("megatron-core")


def _bytes_per_token(batch: Any, codec: str) -> float:
    enc = encode_routes(batch, codec)
    return float(enc.payload.numel()) / max(1, int(batch.valid_N.sum()))


@dataclass
class _Pass:
    mismatch: float
    per_layer: list[float]
    logprobs_N: torch.Tensor


def _padded(rollouts: list[Rollout], batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded tokens ``[B, S]``, routes ``[B, S, L, K]`` and route validity ``[B, S]``."""
    S = max(len(r.token_ids) for r in rollouts)
    ids_BS = torch.zeros(len(rollouts), S, dtype=torch.long)
    for b, r in enumerate(rollouts):
        ids_BS[b, : len(r.token_ids)] = torch.tensor(r.token_ids)
    routes_BSLK, valid_BS = batch.to_padded("right", length=S)
    return ids_BS, routes_BSLK, valid_BS


def _arm_rollout(
    controller: ReplayController,
    routes_BSLK: torch.Tensor,
    valid_BS: torch.Tensor,
    layer_numbers: tuple[int, ...],
) -> None:
    """R3: replay the captured routes in the router's row order ([S, B] flattened); rows
    without a route (the last token, padding) route natively."""
    from rr_megatron_compat import batch_to_router_rows

    controller.set_mode(ReplayMode.REPLAY)
    controller.arm(
        0,
        batch_to_router_rows(routes_BSLK),
        layer_numbers=layer_numbers,
        replay_mask_T=valid_BS.transpose(0, 1).reshape(-1),
    )


def _trainer_forward(
    model: nn.Module, rollouts: list[Rollout], batch: Any, cfg: DemoConfig
) -> Callable[..., _Pass]:
    from rr_megatron_compat import attach

    ids_BS, routes_BSLK, valid_BS = _padded(rollouts, batch)
    moe_BSMK = routes_BSLK[:, :, 1:]

    def run(*, replay: bool) -> _Pass:
        controller = ReplayController(num_experts=cfg.num_experts, top_k=cfg.top_k)
        attach(controller, model)
        try:
            if replay:
                _arm_rollout(controller, routes_BSLK, valid_BS, batch.meta.layer_numbers)
            with torch.no_grad(), route_log(model) as log:
                logits_BSV = _logits(model, ids_BS)
            controller.end_step()
        finally:
            controller.detach()
        per_layer = _mismatch(log.forward, moe_BSMK, valid_BS)
        logp_BSV = torch.log_softmax(logits_BSV.float(), dim=-1)
        picked = []
        for b, r in enumerate(rollouts):
            P, G = len(r.prompt_ids), len(r.generated_ids)
            targets = ids_BS[b, P : P + G]
            picked.append(logp_BSV[b, P - 1 : P + G - 1].gather(1, targets[:, None])[:, 0])
        overall = sum(per_layer) / len(per_layer)  # every layer has the same valid rows
        return _Pass(overall, per_layer, torch.cat(picked))

    return run


def _train_step(model: nn.Module, rollouts: list[Rollout], batch: Any, cfg: DemoConfig) -> float:
    """One forward + backward through Megatron's schedule with activation recompute, R3 replay
    on; strict: any armed target left unused raises."""
    from rr_megatron_compat import attach

    ids_BS, routes_BSLK, valid_BS = _padded(rollouts, batch)
    microbatch = {
        "input_ids": ids_BS,
        "position_ids": torch.arange(ids_BS.shape[1]).expand_as(ids_BS),
        "labels": torch.roll(ids_BS, -1, dims=1),
    }
    controller = ReplayController(num_experts=cfg.num_experts, top_k=cfg.top_k)
    model.train()
    attach(controller, model)
    try:
        _arm_rollout(controller, routes_BSLK, valid_BS, batch.meta.layer_numbers)
        (loss,) = train_step(model, [microbatch], controller)
        controller.end_step()
    finally:
        controller.detach()
        model.eval()
    return loss
