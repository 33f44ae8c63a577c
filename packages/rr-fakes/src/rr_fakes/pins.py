"""The releases rr's test sessions pin, and what rr-fakes' CPU harness shims per megatron-core
line, as plain data with no imports: the noxfile loads this file by path (one session per line in
``MEGATRON_LINES``) so that nox never imports torch. The supported ranges and the features rr's
hooks act on are each adapter's own data (``rr_megatron_compat._supported``).
"""

#: What the CPU harness (rr_fakes.megatron) shims or passes per line, as version specifiers.
HARNESS_FEATURES: dict[str, str] = {
    # moe_utils binds te_general_gemm only when Transformer Engine imports, so the router's
    # gating raises NameError without TE.
    "needs_te_gemm_name": ">=0.13,<0.17",
    # megatron.core.transformer.moe.ops.paged_stash imports triton, undeclared: a stand-in.
    "needs_triton": ">=0.18",
    # Layer specs, GPTModel and the stage predicates take vp_stage; 0.12 reads the virtual
    # pipeline rank from global state.
    "vp_stage_kwarg": ">=0.13",
    # Routers of MTP layers carry is_mtp_layer.
    "router_has_is_mtp_layer": ">=0.17",
}

#: The lines nox tests, on Python 3.11 next to the CPU build of torch: line -> (pinned release,
#: extra pip flags for it, extra packages to install with it).
MEGATRON_LINES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # 0.12.3 pulls ~76 packages (modelopt, wandb, ...); numpy and packaging are all it imports.
    "0.12": ("0.12.3", ("--no-deps",), ("numpy", "packaging")),
    # 0.13.1 imports packaging without declaring it.
    "0.13": ("0.13.1", (), ("packaging",)),
    "0.14": ("0.14.0", (), ()),
    "0.15": ("0.15.3", (), ()),
    "0.16": ("0.16.1", (), ()),
    # 0.17+ declare Requires-Python >=3.12 but publish working cp311 wheels; without
    # --only-binary pip tries to build a numpy sdist.
    "0.17": ("0.17.1", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.18": ("0.18.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.19": ("0.19.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
}

#: The verl release whose Megatron engine ``rr_megatron_compat.verl`` replaces names in, installed
#: with ``--no-deps`` (its declared dependencies pull wandb, tensorboard, hydra, torchdata, ...
#: that the engine module never imports).
VERL_RELEASE = "0.9.1"

#: The megatron-core line that verl's engine is exercised on.
VERL_MEGATRON_LINE = "0.19"

#: What ``import verl.workers.engine.megatron.transformer_impl`` imports beyond torch,
#: megatron-core and their own dependencies; each was removed in turn from a working environment
#: and the import then failed. ``orjson`` and ``omegaconf`` are imported but not declared by verl;
#: ``pillow`` is reached through ``verl.utils.dataset``. Their dependencies come with them.
VERL_IMPORT_DEPS: tuple[str, ...] = (
    "ray==2.60.0",  # verl/__init__ -> verl.protocol
    "tensordict==0.10.0",  # verl.protocol; verl declares >=0.8,<=0.10,!=0.9.0
    "orjson==3.13.0",  # verl.protocol
    "transformers==5.10.4",  # verl.utils.torch_functional; verl declares >=5.5.3,<5.11,!=5.6.0
    "omegaconf==2.3.1",  # verl.utils.config
    "codetiming==1.4.0",  # verl.utils.profiler
    "datasets==4.7.0",  # verl.utils.dataset
    "pillow==13.0.0",  # verl.utils.dataset.rl_dataset
    "peft==0.21.2",  # verl.utils.fsdp_utils, reached from verl.workers.engine
)

#: What verl's agent loop (``verl.experimental.agent_loop``: its rollout-to-trainer conversion of
#: ``routed_experts``) imports beyond :data:`VERL_IMPORT_DEPS`.
VERL_ROLLOUT_DEPS: tuple[str, ...] = (
    "hydra-core==1.3.8",
    "cachetools==8.0.2",
    "uvicorn==0.54.0",
    "fastapi==0.165.0",
    "torchdata==0.11.0",  # verl.trainer.ppo.ray_trainer (its DataProto-to-engine conversion)
)

#: What verl's own ``python -m verl.trainer.main_ppo`` job (the ``verl_job`` session) needs
#: beyond :data:`VERL_IMPORT_DEPS` and :data:`VERL_ROLLOUT_DEPS`.
VERL_JOB_DEPS: tuple[str, ...] = (
    "psutil==7.2.2",  # the harness's peak memory of each job's process tree
)

#: The Megatron-Bridge release whose real models (built through its own random-init path, as
#: verl's engine builds them) the ``bridge`` nox session replays, with ``--no-deps``: its
#: declared dependencies pull wandb, mlflow, flashinfer, Transformer Engine extras, ... that
#: building and running a model never imports. It declares Requires-Python >=3.12 but the wheel
#: is pure Python: without --ignore-requires-python pip on 3.11 silently picks 0.3.1 (read with
#: ``pip download``); --only-binary as for megatron-core 0.17+.
BRIDGE_RELEASE = "0.6.2"
BRIDGE_PIP_FLAGS: tuple[str, ...] = ("--no-deps", "--ignore-requires-python", "--only-binary=:all:")

#: The megatron-core line the bridge models are built on (a key of MEGATRON_LINES).
BRIDGE_MEGATRON_LINE = "0.19"

#: What ``import megatron.bridge`` imports beyond torch, megatron-core and their own
#: dependencies; each was removed in turn from a working environment and the import then
#: failed. (On Python 3.11 it also needs ``typing.override``, which rr-fakes' CPU harness
#: backports from typing_extensions while bridge imports and builds.)
BRIDGE_IMPORT_DEPS: tuple[str, ...] = (
    "transformers==5.10.4",  # bridge's HF configs; bridge declares >=5.8,<=5.12.1, verl's pin
    "einops==0.8.2",  # megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention
    "omegaconf==2.3.1",  # megatron.bridge.models.config
)
