"""verl's real FSDP engine (``FSDPEngineWithLMHead``) over tiny transformers MoE models on CPU.

verl 0.9.1 has no CPU platform: its engine asks the platform for the device, builds the FSDP2
mesh on it and logs GPU memory. :func:`fsdp_cpu` supplies a CPU platform and a one-rank gloo
group and puts verl's state back on exit; inside it :func:`fsdp_engine` builds the engine the
way verl does (``FSDPEngineWithLMHead(model, engine, optimizer, checkpoint configs)`` then
``initialize()``: ``from_pretrained`` of a saved tiny model, verl's monkey patch,
``fully_shard``, optimizer), so every step runs verl's own ``forward_backward_batch``,
``forward_step``, packing and loss plumbing unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rr_fakes.shims.hf_models import tiny_model

ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"


def _cpu_platform() -> Any:
    base = importlib.import_module("verl.plugin.platform.platform_base").PlatformBase

    class CpuPlatform(base):  # type: ignore[misc, valid-type]
        """verl's platform interface on the CPU: gloo, torch.cpu, no device memory."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: torch.cpu)

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return CpuPlatform()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fsdp_cpu() -> Iterator[None]:
    """verl's FSDP engine runnable on the CPU: a CPU platform, the engine module's device name
    and memory log pointed at it, and a one-rank gloo group (when none is initialised); all
    put back on exit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns about every engine it cannot load
        engine: Any = importlib.import_module(ENGINE_MODULE)
    manager: Any = importlib.import_module("verl.plugin.platform.platform_manager")
    saved = (manager._current_platform, engine.device_name, engine.log_gpu_memory_usage)
    created = not dist.is_initialized()
    if created:
        address = f"tcp://127.0.0.1:{_free_port()}"
        dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    manager._current_platform = _cpu_platform()
    engine.device_name = "cpu"
    engine.log_gpu_memory_usage = lambda *args, **kwargs: None
    try:
        yield
    finally:
        manager._current_platform, engine.device_name, engine.log_gpu_memory_usage = saved
        if created:
            dist.destroy_process_group()


def fsdp_engine(
    model_type: str,
    *,
    mode: str = "disabled",
    use_remove_padding: bool = True,
    gradient_checkpointing: bool = True,
    seed: int = 0,
    lr: float = 1e-3,
    **engine_options: Any,
) -> Any:
    """An initialised ``FSDPEngineWithLMHead`` (FSDP2, float32, no torch.compile) over
    :func:`rr_fakes.shims.hf_models.tiny_model` ``(model_type, seed=seed)`` saved and loaded back,
    ``router_replay.mode=mode``. Call inside :func:`fsdp_cpu`."""
    config = importlib.import_module("verl.workers.config")
    checkpoint = importlib.import_module("verl.trainer.config").CheckpointConfig
    replay = importlib.import_module("verl.workers.config.engine").EngineRouterReplayConfig
    engine_module = importlib.import_module(ENGINE_MODULE)
    path = tempfile.mkdtemp(prefix=f"rr-verl-fsdp-{model_type}-")
    tiny_model(model_type, seed=seed).save_pretrained(path)
    model_config = config.HFModelConfig(
        path=path,
        load_tokenizer=False,
        use_remove_padding=use_remove_padding,
        enable_gradient_checkpointing=gradient_checkpointing,
        override_config={"attn_implementation": "eager"},  # no flash-attention on the CPU
    )
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = config.FSDPEngineConfig(
        strategy="fsdp2",
        use_torch_compile=False,
        mixed_precision=fp32,
        router_replay=replay(mode=mode),
        **engine_options,
    )
    optimizer_config = config.FSDPOptimizerConfig(lr=lr, clip_grad=1.0)
    engine = engine_module.FSDPEngineWithLMHead(
        model_config, engine_config, optimizer_config, checkpoint()
    )
    with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):
        warnings.simplefilter("ignore")
        engine.initialize()
    return engine


@contextlib.contextmanager
def expert_ids(model: nn.Module) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Per decoder layer (1-based), the ``[rows, K]`` expert ids its experts module received in
    each call (forward and checkpoint recompute alike), in call order: what the MoE block
    computed with, read off the model rather than off rr."""
    seen: dict[int, list[torch.Tensor]] = {}
    with contextlib.ExitStack() as hooks:
        decoder: Any = model.get_decoder()  # type: ignore[operator]
        for index, layer in enumerate(decoder.layers):
            for module in layer.modules():
                experts = getattr(module, "experts", None)
                if isinstance(experts, nn.Module):

                    def hook(_m: Any, args: Any, kwargs: Any, layer: int = index + 1) -> None:
                        ids = kwargs.get("top_k_index", kwargs.get("router_indices"))
                        if ids is None:
                            ids = args[1]
                        seen.setdefault(layer, []).append(ids.detach().clone())

                    hooks.enter_context(experts.register_forward_pre_hook(hook, with_kwargs=True))
        yield seen


def perturb_sharded_routers(model: nn.Module, scale: float = 1.0, *, seed: int = 1) -> None:
    """Add noise to every router weight of an FSDP2 model (one rank: the local shard is the
    whole weight), so that native routing moves away from a recorded one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.lower().endswith("router"):
                weight: Any = module.weight
                local = weight.to_local() if hasattr(weight, "to_local") else weight
                local.add_(torch.randn(local.shape, generator=generator) * scale)
