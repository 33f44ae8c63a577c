"""What a demo run is asked to do: the configs (one per trainer backend), the rollout engines
to choose from, and the demo's errors. Every other module of rr_demo reads these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from rr_core import RRError

#: Called with each stage's name as it starts.
Progress = Callable[[str], None]

#: ``--engine``: a real vLLM engine, rr_fakes' emulated one, or vllm where it runs.
ENGINES = ("auto", "vllm", "emulated")


class DemoError(RRError):
    """A demo run that cannot run as asked."""


class EngineUnavailableError(DemoError, RuntimeError):
    """``--engine vllm`` where no vLLM engine can run."""


class UnknownEngineError(DemoError, ValueError):
    """An engine name that is not one of ``ENGINES``."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine the demo runs and why."""

    engine: str  # "vllm" or "emulated"
    reason: str


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """The rollout: ``batch`` sampled continuations (temperature 1) of ``new_tokens`` tokens
    after random prompts of ``prompt_length``."""

    batch: int = 8
    prompt_length: int = 10
    new_tokens: int = 12
    noise: float = 0.006  # std of the emulated engine's router-score perturbation
    seed: int = 7
    #: "emulated" (rr_fakes' engine), "vllm" (a real engine; raises where none runs) or "auto"
    #: (vllm where it runs, emulated otherwise). ``rr demo`` passes "auto" unless told.
    engine: str = "emulated"
    engine_dtype: str = "bfloat16"  # the real engine's dtype (the trainer runs float32)

    #: The trainer backend (a name of ``rr_demo.chain.TRAINER_MODULES``), one per config class.
    backend: ClassVar[str]

    @property
    def engine_family(self) -> str:
        """The family of the tiny checkpoint a real engine serves."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class DemoConfig(Sampling):
    """Megatron: a small GPTModel, dense first layer, 16 experts, top-4; sampled rollouts.
    With the real engine the model is the tiny ``checkpoint_family`` checkpoint instead (the
    sizes below are then unused)."""

    backend: ClassVar[str] = "megatron"
    num_layers: int = 6
    num_experts: int = 16
    top_k: int = 4
    hidden_size: int = 64
    vocab_size: int = 128

    checkpoint_family: str = "qwen3_moe"

    @property
    def moe_layer_freq(self) -> list[int]:
        return [0] + [1] * (self.num_layers - 1)

    @property
    def engine_family(self) -> str:
        return self.checkpoint_family


@dataclass(frozen=True, kw_only=True)
class TransformersDemoConfig(Sampling):
    """transformers: a tiny random-initialised model of ``family`` (a model_type of
    ``rr_fakes.shims.hf_models.FAMILY_CONFIGS``); its routers score in the family's own units
    (probabilities, sigmoid scores or logits), so the engine noise is larger."""

    backend: ClassVar[str] = "transformers"
    family: str = "qwen3_moe"
    noise: float = 0.02

    @property
    def engine_family(self) -> str:
        return self.family
