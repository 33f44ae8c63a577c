"""The main job end to end on CPU: roll out with a real vLLM engine (where the CPU build runs,
on a tiny Hugging Face checkpoint) or an emulated one, capture routes as vLLM returns them,
decode, compress and store them, then run a real trainer without and with R3 replay and
measure what changed.

With the real engine (``engine="vllm"``, or ``"auto"`` where vLLM runs: see
:mod:`rr_demo.engine`) the trainer is the engine's own checkpoint: Megatron loads it through
``rr_fakes.megatron.hf_loader``, transformers through ``from_pretrained``, both in float32,
against a bfloat16 engine. With the emulated engine the trainer is a randomly initialised model
whose routers the engine perturbs.

The chain and its figures are the same for every trainer; a backend (Megatron in
:mod:`rr_demo.megatron_run`, transformers in :mod:`rr_demo.transformers_run`) builds the model
and says how it runs a forward, how routes are armed for it and which experts it used.

Shapes: B sequences, S padded length, T tokens, L layer slots (all layers), K top-k,
E experts, V vocabulary.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from rr_core import (
    CODECS,
    ReplayController,
    RouteBatch,
    RouteMeta,
    encode_routes,
    load_routes,
    save_routes,
)
from rr_fakes import Rollout, RolloutEmulator
from rr_fakes.engines import VllmEra

if TYPE_CHECKING:
    from rr_demo.engine import EngineChoice, EngineRollout

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class _Sampling:
    batch: int = 8
    prompt_length: int = 10
    new_tokens: int = 12
    noise: float = 0.006  # std of the engine's router-score perturbation (kernel numerics)
    seed: int = 7
    #: "emulated" (rr_fakes' engine), "vllm" (a real engine; raises where none runs) or "auto"
    #: (vllm where it runs, emulated otherwise). ``rr demo`` passes "auto" unless told.
    engine: str = "emulated"
    engine_dtype: str = "bfloat16"  # the real engine's dtype (the trainer runs float32)


@dataclass(frozen=True, kw_only=True)
class DemoConfig(_Sampling):
    """Megatron: a small GPTModel, dense first layer, 16 experts, top-4; sampled rollouts.
    With the real engine the model is the tiny ``checkpoint_family`` checkpoint instead (the
    sizes below are then unused)."""

    num_layers: int = 6
    num_experts: int = 16
    top_k: int = 4
    hidden_size: int = 64
    vocab_size: int = 128

    checkpoint_family: str = "qwen3_moe"

    @property
    def moe_layer_freq(self) -> list[int]:
        return [0] + [1] * (self.num_layers - 1)


@dataclass(frozen=True, kw_only=True)
class TransformersDemoConfig(_Sampling):
    """transformers: a tiny random-initialised model of ``family`` (a model_type of
    ``rr_fakes.hf_models.FAMILY_CONFIGS``); its routers score in the family's own units
    (probabilities, sigmoid scores or logits), so the engine noise is larger."""

    family: str = "qwen3_moe"
    noise: float = 0.02


@dataclass(kw_only=True)
class DemoResult:
    """The figures the demo reports (``--json`` prints them)."""

    backend: str = "megatron"
    megatron_core_version: str | None = None  # the megatron backend
    transformers_version: str | None = None  # the transformers backend
    model_type: str | None = None  # the transformers family
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
    engine: str = "emulated"  # the rollout engine that ran: "vllm" or "emulated"
    engine_reason: str = ""  # why that engine
    engine_version: str | None = None  # the real engine's vLLM release
    engine_dtype: str | None = None  # the real engine's dtype
    checkpoint: str | None = None  # the real engine's checkpoint family


@dataclass(frozen=True)
class Padded:
    """The rollouts as the trainer's micro-batch: right-padded tokens ``[B, S]``, their
    attention mask, routes ``[B, S, L, K]`` with their validity ``[B, S]`` (the last token of
    each sequence and padding have none), and the decoded batch itself."""

    ids_BS: torch.Tensor
    mask_BS: torch.Tensor
    routes_BSLK: torch.Tensor
    valid_BS: torch.Tensor
    batch: RouteBatch


class Trainer(Protocol):
    """What the chain needs from a backend once its model is built."""

    model: nn.Module
    num_experts: int
    top_k: int
    vocab_size: int
    num_layers: int  # the all-layers axis

    def forward(self, model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, S, V]`` of one unpadded sequence (the engine's forward)."""
        ...

    def attach_recorder(self, recorder: ReplayController, model: nn.Module) -> tuple[int, ...]:
        """Give the engine's recorder the routers; returns their layer numbers."""
        ...

    def trainer_forward(
        self, padded: Padded, *, replay: bool
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """No-grad forward over the batch, R3 armed or not: per MoE layer the experts each
        token was sent to (bool ``[B, S, E]``, read from the model), and logits ``[B, S, V]``."""
        ...

    def train_step(self, padded: Padded) -> float:
        """One forward + backward under R3 replay with activation recompute; the loss."""
        ...

    def versions(self) -> dict[str, str]:
        """The DemoResult fields naming the trainer (its library version, the model)."""
        ...


def run_demo(
    cfg: DemoConfig | TransformersDemoConfig = DemoConfig(),
    *,
    progress: Progress = lambda stage: None,
) -> DemoResult:
    """Every stage of the demo; ``progress`` is called with each stage's name as it starts.
    A :class:`TransformersDemoConfig` runs it on a transformers model (no megatron imported)."""
    from rr_demo.engine import choose_engine

    start = time.perf_counter()
    if isinstance(cfg, TransformersDemoConfig):
        choice = choose_engine(cfg.engine, "transformers", cfg.family)
    else:
        choice = choose_engine(cfg.engine, "megatron", cfg.checkpoint_family)
    checkpoint, engine = None, None
    if choice.engine == "vllm":
        checkpoint, engine = _real_rollout(cfg, progress)
    session: AbstractContextManager[Trainer]
    if isinstance(cfg, TransformersDemoConfig):
        from rr_demo.transformers_run import transformers_trainer

        session, backend = transformers_trainer(cfg, progress, checkpoint), "transformers"
    else:
        from rr_demo.megatron_run import megatron_trainer

        session, backend = megatron_trainer(cfg, progress, checkpoint), "megatron"
    with session as trainer:
        return _chain(
            trainer, cfg, progress, backend=backend, start=start, choice=choice, engine=engine
        )


def _real_rollout(
    cfg: DemoConfig | TransformersDemoConfig, progress: Progress
) -> tuple[Any, EngineRollout]:
    """The tiny checkpoint of the config's family and a real vLLM engine's rollout on it."""
    from rr_demo.engine import vllm_rollout
    from rr_fakes.hf_checkpoints import build_checkpoint

    family = cfg.family if isinstance(cfg, TransformersDemoConfig) else cfg.checkpoint_family
    checkpoint = build_checkpoint(family)
    progress(f"roll out with a real vLLM engine ({family} checkpoint, {cfg.engine_dtype})")
    engine = vllm_rollout(
        checkpoint,
        batch=cfg.batch,
        prompt_length=cfg.prompt_length,
        new_tokens=cfg.new_tokens,
        seed=cfg.seed,
        dtype=cfg.engine_dtype,
    )
    return checkpoint, engine


class _Tokens(Protocol):
    """A sampled sequence: an emulated :class:`~rr_fakes.Rollout` or a real engine's."""

    @property
    def prompt_ids(self) -> SequenceOf[int]: ...
    @property
    def generated_ids(self) -> SequenceOf[int]: ...
    @property
    def token_ids(self) -> SequenceOf[int]: ...


def _chain(
    trainer: Trainer,
    cfg: _Sampling,
    progress: Progress,
    *,
    backend: str,
    start: float,
    choice: EngineChoice,
    engine: EngineRollout | None,
) -> DemoResult:
    from rr_vllm import decode_vllm_output, validate_samples

    rollouts: list[_Tokens]
    real: dict[str, Any] = {}
    if engine is None:
        progress("roll out with an emulated engine (noisy router numerics)")
        emulated, engine_logprobs = _rollouts(trainer, cfg)
        progress("capture routes as vLLM 0.33 returns them, decode and validate")
        layers = tuple(range(1, trainer.num_layers + 1))
        meta = RouteMeta(
            num_experts=trainer.num_experts,
            top_k=trainer.top_k,
            layer_axis="all_layers",
            layer_numbers=layers,
            moe_layer_numbers=emulated[0].moe_layer_numbers,
        )
        outputs = [r.vllm_output(VllmEra.V0_32) for r in emulated]
        samples = [s for out in outputs for s in decode_vllm_output(out, meta)]
        batch = validate_samples(samples, meta)
        objects, rollouts = type(outputs[0]).__module__, list(emulated)
    else:
        from rr_demo.engine import engine_version

        progress("routes as the real engine returned them, decoded and validated by rr_vllm")
        batch, meta, objects = engine.batch, engine.batch.meta, engine.objects
        rollouts = list(engine.sequences)
        engine_logprobs = [s.logprobs for s in engine.sequences]
        real = {
            "engine_version": engine_version(),
            "engine_dtype": engine.dtype,
            "checkpoint": engine.family,
        }
    progress("encode with each codec, write and re-read a record file")
    sizes: dict[str, float] = {c: _bytes_per_token(batch, c) for c in CODECS}
    with tempfile.TemporaryDirectory() as tmp:
        path = save_routes(Path(tmp) / "rollout.rr", batch, codec="packed")
        file_bytes = path.stat().st_size
        if not load_routes(path).equal(batch):
            raise AssertionError("a record file did not round-trip")
    progress("trainer forward without and with R3 replay")
    padded = _padded(rollouts, batch)
    without = _measured(trainer, padded, rollouts, replay=False)
    with_replay = _measured(trainer, padded, rollouts, replay=True)
    progress("training step under replay (forward + backward, activation recompute)")
    loss = trainer.train_step(padded)
    rollout_N = torch.cat(engine_logprobs)
    abs_without, kl_without = _kl_k3(without.logprobs_N, rollout_N)
    abs_with, kl_with = _kl_k3(with_replay.logprobs_N, rollout_N)
    return DemoResult(
        backend=backend,
        **trainer.versions(),
        vllm_objects=objects,
        mismatch_without_replay=without.mismatch,
        mismatch_with_replay=with_replay.mismatch,
        kl_without_replay=kl_without,
        kl_with_replay=kl_with,
        logprob_abs_diff_without_replay=abs_without,
        logprob_abs_diff_with_replay=abs_with,
        bytes_per_token=sizes,
        record_file_bytes=file_bytes,
        train_loss_with_replay=loss,
        layers=list(meta.routed_layer_numbers),
        mismatch_per_layer_without_replay=without.per_layer,
        mismatch_per_layer_with_replay=with_replay.per_layer,
        seconds=time.perf_counter() - start,
        engine=choice.engine,
        engine_reason=choice.reason,
        **real,
    )


def _rollouts(trainer: Trainer, cfg: _Sampling) -> tuple[list[Rollout], list[torch.Tensor]]:
    """Sampled continuations with noisy routing, and the engine's log-prob of each new token."""
    steps: list[torch.Tensor] = []

    def engine_forward(m: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        logits = trainer.forward(m, ids_1S)
        steps.append(torch.log_softmax(logits[0, -1].float(), dim=-1))
        return logits

    emulator = RolloutEmulator(
        trainer.model,
        trainer.num_experts,
        trainer.top_k,
        num_layers=trainer.num_layers,
        noise=cfg.noise,
        seed=cfg.seed,
        forward=engine_forward,
        attach=trainer.attach_recorder,
    )
    g = torch.Generator().manual_seed(cfg.seed)
    rollouts, logprobs = [], []
    for _ in range(cfg.batch):
        prompt = torch.randint(0, trainer.vocab_size, (cfg.prompt_length,), generator=g).tolist()
        steps.clear()
        rollout = emulator.generate(prompt, max_new_tokens=cfg.new_tokens, temperature=1.0)
        new = torch.tensor(rollout.generated_ids)
        logprobs.append(torch.stack(steps)[torch.arange(len(new)), new])
        rollouts.append(rollout)
    return rollouts, logprobs


def _padded(rollouts: list[_Tokens], batch: RouteBatch) -> Padded:
    S = max(len(r.token_ids) for r in rollouts)
    ids_BS = torch.zeros(len(rollouts), S, dtype=torch.long)
    mask_BS = torch.zeros(len(rollouts), S, dtype=torch.long)
    for b, r in enumerate(rollouts):
        ids_BS[b, : len(r.token_ids)] = torch.tensor(r.token_ids)
        mask_BS[b, : len(r.token_ids)] = 1
    routes_BSLK, valid_BS = batch.to_padded("right", length=S)
    return Padded(ids_BS, mask_BS, routes_BSLK, valid_BS, batch)


@dataclass
class _Pass:
    mismatch: float
    per_layer: list[float]
    logprobs_N: torch.Tensor


def _measured(trainer: Trainer, padded: Padded, rollouts: list[_Tokens], *, replay: bool) -> _Pass:
    used, logits_BSV = trainer.trainer_forward(padded, replay=replay)
    per_layer = mismatch_per_layer(used, padded.routes_BSLK, padded.valid_BS)
    logp_BSV = torch.log_softmax(logits_BSV.float(), dim=-1)
    picked = []
    for b, r in enumerate(rollouts):
        P, G = len(r.prompt_ids), len(r.generated_ids)
        targets = padded.ids_BS[b, P : P + G]
        picked.append(logp_BSV[b, P - 1 : P + G - 1].gather(1, targets[:, None])[:, 0])
    overall = sum(per_layer) / len(per_layer)  # every layer has the same valid rows
    return _Pass(overall, per_layer, torch.cat(picked))


def mismatch_per_layer(
    used: dict[int, torch.Tensor], routes_BSLK: torch.Tensor, valid_BS: torch.Tensor
) -> list[float]:
    """Per MoE layer (ascending): share of valid (token, layer) rows whose expert set in the
    trainer (``used[layer]``, bool ``[B, S, E]``) differs from the rollout's (slot layer - 1 of
    the all-layers axis)."""
    shares = []
    for layer in sorted(used):
        used_BSE = used[layer]
        target_BSK = routes_BSLK[:, :, layer - 1].long()
        want_BSE = torch.zeros_like(used_BSE).scatter(2, target_BSK, True)
        differs_BS = (used_BSE != want_BSE).any(dim=-1) & valid_BS
        shares.append(float(differs_BS.sum()) / max(1, int(valid_BS.sum())))
    return shares


def _kl_k3(train_N: torch.Tensor, rollout_N: torch.Tensor) -> tuple[float, float]:
    """Mean |delta log p| and the k3 estimate of KL(rollout || trainer) on rollout samples."""
    log_ratio = train_N - rollout_N
    k3 = torch.expm1(log_ratio) - log_ratio
    return float(log_ratio.abs().mean()), float(k3.mean())


def _bytes_per_token(batch: Any, codec: str) -> float:
    enc = encode_routes(batch, codec)
    return float(enc.payload.numel()) / max(1, int(batch.valid_N.sum()))
