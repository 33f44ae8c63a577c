"""verl's platform plugin for a machine without an accelerator: the module named by
``VERL_USE_EXTERNAL_MODULES``, imported by ``verl/__init__`` in every process that imports
verl (the driver, each Ray worker, vLLM's own engine processes); ``VERL_PLATFORM=cpu`` then
selects the platform registered here.

verl 0.9.1 falls back to its 'nvidia' platform where no GPU is found
(``verl/plugin/platform/platform_manager.py`` ``_detect_platform_name``) and then asks torch's
CUDA module for every device query. The 'cpu' platform answers with the CPU: device ``cpu``,
collectives on gloo, ``torch.cpu`` as the device module with zeros for the memory queries
torch's CPU module does not have. Ray schedules verl's workers on a logical GPU (verl asks its
placement bundles for ``GPU``), which the job's ``ray_init`` declares.

Importing this module also applies the job's patches (:mod:`rr_fakes.shims.verl_job.patches`),
each guarded by the releases it was checked on.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import torch

from rr_fakes.shims.verl_job import mcore, patches

PLATFORM_NAME = "cpu"


class DeviceIndex(str):
    """The CPU's device "index": ``"cpu"`` where verl moves a module or tensor to it
    (``module.to(get_device_id())``, ``torch.device(get_device_id())``) and ``0`` where verl
    formats a device string with it (``f"{get_device_name()}:{get_device_id()}"``,
    ``bucketed_weight_transfer.py:183``), which would otherwise read ``cpu:cpu``."""

    def __new__(cls) -> DeviceIndex:
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __index__(self) -> int:
        return 0


class _Stream:
    """torch.cpu.Stream's stand-in where verl calls CUDA-stream methods on it."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return event


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus what verl asks of a device module that torch's CPU module lacks:
    memory queries (zero: no device memory), the allocator's cache (nothing to free), the
    RNG state (the CPU generator's)."""
    module = types.ModuleType("rr_fakes.shims.verl_job.cpu_device")
    zero = staticmethod(lambda *args, **kwargs: 0)
    stubs: dict[str, Any] = {
        "memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_allocated": zero,
        "max_memory_reserved": zero,
        "reset_peak_memory_stats": lambda *a, **k: None,
        "mem_get_info": lambda *a, **k: (0, 0),
        "empty_cache": lambda: None,
        "ipc_collect": lambda: None,
        "set_per_process_memory_fraction": lambda *a, **k: None,
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_device_name": lambda *a, **k: "cpu",
        "current_device": DeviceIndex,
        "set_device": lambda *a, **k: None,
        "device_count": lambda: 1,
        "is_available": lambda: True,
        "synchronize": lambda *a, **k: None,
        "current_stream": lambda *a, **k: _Stream(),
        "Stream": lambda *a, **k: _Stream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "Event": torch.cpu.Event if hasattr(torch.cpu, "Event") else _Stream,
    }
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    for name, value in stubs.items():
        setattr(module, name, value.__func__ if isinstance(value, staticmethod) else value)
    return module


def register() -> None:
    """Register the 'cpu' platform with verl (its registry overrides a name registered
    before, so importing this module twice is harmless)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    device = _device_module()

    class CPUPlatform(PlatformBase):  # type: ignore[misc]
        """verl on the CPU (see the module doc)."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return True

        def current_device(self) -> Any:
            return DeviceIndex()

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPU it hands out

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # the logical GPU the job's ray_init declares

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False  # no CUDA IPC: verl's weight transfer takes shared memory

        def rollout_env_vars(self) -> dict[str, str]:
            return {}

        def get_collective_module(self) -> Any:
            return None

        def cudart(self) -> Any:
            return None

    PlatformRegistry.register(PLATFORM_NAME)(CPUPlatform)


register()
patches.apply()
if os.environ.get(mcore.ENV):
    mcore.arm()
