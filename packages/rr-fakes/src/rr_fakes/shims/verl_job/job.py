"""One run of verl's own ``python -m verl.trainer.main_ppo``: the Hydra overrides that make it
run on this CPU machine, with or without rr, and its wall time and peak memory (the whole
process tree: the driver, Ray's processes, verl's workers, vLLM's engine processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rr_fakes.shims.megatron._cpu_fields import CPU_TRANSFORMER_FIELDS
from rr_fakes.shims.ray_tmp import ray_tmpdir
from rr_fakes.shims.verl_job import mcore

PLUGIN = "rr_fakes.shims.verl_job.platform"
RR_HOOK = "rr_fakes.shims.verl_job.rr_hook.install"
MEASURE_HOOK = "rr_fakes.shims.verl_job.rr_hook.measure"
#: The Megatron engine's transformer-config overrides on CPU (the fields of every CPU build; verl
#: sets the alltoall dispatcher and no balancing loss itself).
CPU_TRANSFORMER_CONFIG = CPU_TRANSFORMER_FIELDS
#: How often the process tree's memory is sampled.
SAMPLE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One job of the matrix: verl's actor engine and whether rr is switched on."""

    engine: str  # "fsdp2" or "megatron"
    rr: bool
    steps: int = 2

    @property
    def name(self) -> str:
        return f"{self.engine}-{'rr' if self.rr else 'verl'}"


@dataclass(frozen=True)
class JobRun:
    spec: JobSpec
    returncode: int
    wall_s: float
    peak_rss_mib: float
    metrics: Path
    reports: Path
    log: Path


def environment(work: Path, spec: JobSpec) -> dict[str, str]:
    """The variables every process of the job reads (Ray's workers inherit the driver's)."""
    env = dict(os.environ)
    # verl's vLLM server runs its engine core in a process of its own (vLLM's default)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.update(
        {
            "VERL_USE_EXTERNAL_MODULES": PLUGIN,
            "VERL_PLATFORM": "cpu",
            "VERL_ENGINE_DEVICE": "cuda",  # verl's own override: FSDP registers cuda / npu only
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VERL_FILE_LOGGER_PATH": str(work / f"{spec.name}.metrics.jsonl"),
            "RR_VERL_JOB_REPORTS": str(work / f"{spec.name}.rr.jsonl"),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "RAY_DEDUP_LOGS": "0",
            "TMPDIR": str(ray_tmpdir()),  # Ray's session folder, outside nox's virtualenv
        }
    )
    if spec.engine == "megatron":  # rr's megatron-core harness where a process imports megatron
        env[mcore.ENV] = "1"
    return env


def main_ppo(spec: JobSpec) -> list[str]:
    """verl's trainer, with its config for the job's engine (the Megatron engine's nests the
    actor's engine settings under ``actor.megatron``)."""
    command = [sys.executable, "-m", "verl.trainer.main_ppo"]
    if spec.engine == "megatron":
        command.append("--config-name=ppo_megatron_trainer")
    return command


def overrides(
    spec: JobSpec, model: Path, train: Path, val: Path, reward: Path, work: Path
) -> list[str]:
    """verl's Hydra overrides for a two-step GRPO job on CPU (each line says why)."""
    actor = "actor_rollout_ref.actor"
    lines = [
        "algorithm.adv_estimator=grpo",
        "trainer.use_v1=false",  # the v1 trainer needs the transfer_queue package
        f"trainer.total_training_steps={spec.steps}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=4",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",  # no flash-attn
        f"{actor}.strategy={spec.engine}",
        f"{actor}.ppo_mini_batch_size=4",
        # two micro-batches a pass (4 prompts x 2 samples, 4 a micro-batch): each armed apart
        f"{actor}.ppo_micro_batch_size_per_gpu=4",
        f"{actor}.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.dtype=float32",  # the engine's log-probs comparable
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",  # refused on CPU
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",  # R3 from the engine
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        # verl asks placement bundles {"CPU": 3, "GPU": 1}: a logical GPU and 8 logical CPUs
        # (with the machine's 2 the placement group never schedules and the job waits forever)
        "+ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=false",
        # the harness's figures in every worker, with rr's sides where the job has rr
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
        + (RR_HOOK if spec.rr else MEASURE_HOOK),
    ]
    if spec.engine == "fsdp2":
        lines += [
            # float32 weights, verl's default bfloat16 autocast in the forward: the trainer then
            # routes some (token, layer) pairs otherwise than the float32 engine (with float32
            # on both sides none differ here, and replay has nothing to correct)
            f"{actor}.fsdp_config.model_dtype=fp32",
            f"{actor}.fsdp_config.use_torch_compile=false",
        ]
    if spec.engine == "megatron":  # verl's own R3, or rr's where the hook installs it
        megatron = f"{actor}.megatron"
        lines += [
            f"{megatron}.router_replay.mode=R3",  # (bfloat16: verl refuses any other dtype)
            f"{megatron}.sequence_parallel=false",  # one rank: no tensor parallelism
            f"{megatron}.use_distributed_optimizer=false",
            # verl's default is flash-attention (Transformer Engine): Megatron's own attention
            f"{megatron}.override_transformer_config.attention_backend=local",
        ]
        # what rr's bridge harness sets on every CPU build: no fused kernels (Transformer
        # Engine / apex / torch.compile), no grouped GEMM, CPU initialisation
        lines += [
            f"+{megatron}.override_transformer_config.{name}={str(value).lower()}"
            for name, value in CPU_TRANSFORMER_CONFIG.items()
        ]
    elif spec.rr:  # verl's FSDP engine yaml has no router_replay entry: `+` adds it
        lines.append(f"+{actor}.fsdp_config.router_replay.mode=R3")
    return lines


#: What Ray 2.60 raises where its raylet does not register within its fixed 30 s
#: (``ray/_private/node.py:440``): on a machine loaded by other work, before verl runs anything.
RAY_START_TIMEOUT = "The current node timed out during startup"


def ray_start_failed(run: JobRun) -> bool:
    """Whether the job failed only because Ray's local node did not start in time."""
    return run.returncode != 0 and RAY_START_TIMEOUT in run.log.read_text(errors="replace")


def _tree_rss(root: int) -> int:
    import psutil

    try:
        process = psutil.Process(root)
        tree = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for member in tree:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def run(
    spec: JobSpec, model: Path, train: Path, val: Path, reward: Path, work: Path, timeout_s: float
) -> JobRun:
    """Run the job to its end, sampling its process tree's memory (Ray's processes are the
    driver's descendants: ``ray.init`` starts the local cluster from it)."""
    env = environment(work, spec)
    for stale in ("VERL_FILE_LOGGER_PATH", "RR_VERL_JOB_REPORTS"):
        Path(env[stale]).unlink(missing_ok=True)
    log = work / f"{spec.name}.log"
    command = [*main_ppo(spec), *overrides(spec, model, train, val, reward, work)]
    start = time.monotonic()
    peak = 0
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                peak = max(peak, _tree_rss(process.pid))
                if time.monotonic() - start > timeout_s:
                    process.kill()
                    break
                time.sleep(SAMPLE_S)
        finally:
            process.wait()
    return JobRun(
        spec=spec,
        returncode=process.returncode,
        wall_s=time.monotonic() - start,
        peak_rss_mib=peak / 2**20,
        metrics=Path(env["VERL_FILE_LOGGER_PATH"]),
        reports=Path(env["RR_VERL_JOB_REPORTS"]),
        log=log,
    )
