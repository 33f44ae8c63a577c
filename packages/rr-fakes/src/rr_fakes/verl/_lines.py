"""The verl release the verl harness drives, and what its Megatron engine module needs to import
on Python 3.11 next to the CPU build of torch and megatron-core 0.19.

Plain data with no imports: the noxfile reads this file by path, so the pins are written once.
"""

#: The verl release, installed with ``--no-deps`` (its declared dependencies pull wandb,
#: tensorboard, hydra, torchdata, ... that the engine module never imports).
VERL_RELEASE = "0.9.1"

#: The megatron-core line that verl 0.9.1's engine is exercised on here.
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
)
