"""The one place that decides the device type, the collective backend and the visible-devices
variable.

Ascend is explicit opt-in: nothing here probes for an NPU on import, and ``torch_npu`` is
imported only by :func:`import_torch_npu` (an installed torch-npu without Huawei's CANN
libraries fails on import, and through torch's device-backend autoload can break
``import torch`` itself). Every answer is computed when asked, never frozen at import time, so a
process that sets ``RR_DEVICE`` or loads torch_npu later gets the new answer.

``RR_DEVICE`` (``npu`` / ``cuda`` / ``cpu``) forces a choice; without it, ``npu`` is chosen only
when torch_npu is *already imported* (the caller opted in) and reports an available device,
then CUDA when available, else CPU.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from rr_core import RRError

DeviceType = Literal["npu", "cuda", "cpu"]
Backend = Literal["hccl", "nccl", "gloo"]

ENV_DEVICE = "RR_DEVICE"
BACKENDS: dict[str, Backend] = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
VISIBLE_DEVICES: dict[str, str | None] = {
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "cuda": "CUDA_VISIBLE_DEVICES",
    "cpu": None,
}


class NpuUnavailableError(RRError, ImportError):
    """torch_npu cannot be imported (not installed, or installed without CANN)."""


class DeviceChoiceError(RRError, ValueError):
    """A device type (``prefer``, ``RR_DEVICE``) or index that is not one rr can choose."""


@dataclass(frozen=True)
class DeviceChoice:
    """What :func:`device_choice` decided, and why."""

    device_type: DeviceType
    backend: Backend
    visible_devices_var: str | None
    reason: str

    def device(self, index: int | None = None) -> Any:
        """``torch.device`` of this type (``npu:N`` parses once torch_npu is loaded)."""
        import torch

        from rr_core.routes.args import as_index

        if index is not None and as_index(index, "device index", DeviceChoiceError) < 0:
            raise DeviceChoiceError(f"device index must be >= 0; got {index}")
        return torch.device(self.device_type if index is None else f"{self.device_type}:{index}")

    def visible_devices(self) -> str | None:
        """The current value of the visible-devices variable (read now)."""
        return (
            None if self.visible_devices_var is None else os.environ.get(self.visible_devices_var)
        )


def import_torch_npu() -> Any:
    """Import torch_npu (the explicit opt-in); :class:`NpuUnavailableError` with the fix when it
    cannot be imported."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError as error:
        raise NpuUnavailableError(
            f"torch_npu could not be imported ({error}). It needs Huawei's CANN libraries "
            "(source the CANN set_env.sh so libhccl.so is found); run `rr doctor` for details. "
            "If an installed torch-npu breaks `import torch`, set TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        ) from error


def _npu_loaded_and_available() -> bool:
    if "torch_npu" not in sys.modules or "torch" not in sys.modules:
        return False
    npu = getattr(sys.modules["torch"], "npu", None)
    return bool(npu is not None and npu.is_available())


def _cuda_available() -> bool:
    if "torch" not in sys.modules:
        return False
    return bool(sys.modules["torch"].cuda.is_available())


def _choice(device_type: DeviceType, reason: str) -> DeviceChoice:
    return DeviceChoice(device_type, BACKENDS[device_type], VISIBLE_DEVICES[device_type], reason)


def device_choice(prefer: str | None = None) -> DeviceChoice:
    """Decide now. ``prefer`` (or ``RR_DEVICE``) forces a type; ``"npu"`` then imports
    torch_npu (explicit opt-in) and raises if it or a device is missing."""
    wanted = prefer if prefer is not None else os.environ.get(ENV_DEVICE) or None
    if wanted is not None:
        if not isinstance(wanted, str) or wanted not in BACKENDS:
            raise DeviceChoiceError(
                f"device type must be one of {sorted(BACKENDS)} (exact, lower case); got "
                f"{wanted!r} (from {'prefer' if prefer is not None else ENV_DEVICE}); pass one of "
                f"them, or unset {ENV_DEVICE} to choose automatically"
            )
        if wanted == "npu":
            import_torch_npu()
            if not _npu_loaded_and_available():
                raise NpuUnavailableError(
                    "torch_npu imported but torch.npu reports no available device; check "
                    f"{VISIBLE_DEVICES['npu']}={os.environ.get('ASCEND_RT_VISIBLE_DEVICES')!r}"
                )
        source = "prefer" if prefer is not None else ENV_DEVICE
        return _choice(wanted, f"{source}={wanted}")  # type: ignore[arg-type]
    if _npu_loaded_and_available():
        return _choice("npu", "torch_npu is imported and torch.npu has a device")
    if _cuda_available():
        return _choice("cuda", "torch.cuda has a device")
    return _choice("cpu", "no accelerator chosen")


def device_type() -> DeviceType:
    return device_choice().device_type


def collective_backend() -> Backend:
    return device_choice().backend


def visible_devices_var() -> str | None:
    return device_choice().visible_devices_var
