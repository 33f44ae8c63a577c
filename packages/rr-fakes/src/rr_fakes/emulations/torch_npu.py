"""An emulated ``torch_npu`` for CPU tests, written from ``npu-facts.md``.

What it mirrors:

- PyTorch's PrivateUse1 backend renamed "npu": ``torch.device("npu:0")`` parses, allocating on
  it raises ``NotImplementedError`` (no kernels), so tensors stay on CPU while the code that
  chooses devices, backends and environment variables runs;
- a ``torch.npu`` device module (``is_available``, ``device_count``, ``current_device``,
  ``set_device``, ``synchronize``) registered the way torch_npu registers its own;
- HCCL's collective dtype table (int16 and uint8 yes; uint16/32/64 no);
- ``torch_npu.npu_moe_gating_top_k``: int32 expert ids, inference only, no forced ids (it can
  never replay); every call is recorded;
- the ``TORCH_DEVICE_BACKEND_AUTOLOAD`` trap: an installed torch_npu without CANN breaks
  ``import torch`` through torch's ``torch.backends`` entry point (see :func:`autoload_trap`).

``torch.utils.rename_privateuse1_backend`` can be called only once per process (a second call
with another name raises), so the rename is permanent: after the context exits ``npu:0`` still
parses and ``sys.modules["torch_npu"]`` is gone. torch then takes "npu" for the process's
accelerator, and its accelerator queries (``torch.utils.checkpoint`` asks one on every call) need
a ``torch.npu`` module, so an unavailable one with no devices stays in place. A process whose
PrivateUse1 backend already has another name cannot use this emulation.

Shapes: T tokens, E experts, K top-k.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint
from torch.utils.backend_registration import rename_privateuse1_backend

# The one table of what HCCL accepts lives with the policy that depends on it (an import-free
# module: no torch_npu, no CANN).
from rr_npu import HCCL_COLLECTIVE_DTYPES as _HCCL_DTYPE_NAMES

NPU = "npu"
_DEFAULT_NAME = "privateuseone"

#: dtypes HCCL collectives accept (no uint16 / uint32 / uint64): rr_npu's table, as torch dtypes.
HCCL_COLLECTIVE_DTYPES: frozenset[torch.dtype] = frozenset(
    getattr(torch, name) for name in _HCCL_DTYPE_NAMES
)


def check_hccl_dtype(dtype: torch.dtype) -> None:
    """Raise as HCCL does for a collective on an unsupported dtype."""
    if dtype not in HCCL_COLLECTIVE_DTYPES:
        raise RuntimeError(f"HCCL does not support data type {dtype} in collectives")


def ensure_npu_backend_name() -> None:
    """Rename PrivateUse1 to "npu" unless already done (once per process, see module doc)."""
    name = torch._C._get_privateuse1_backend_name()
    if name == NPU:
        return
    if name != _DEFAULT_NAME:
        raise RuntimeError(
            f"PrivateUse1 is already named {name!r} in this process and torch allows one rename "
            "only; run NPU-emulation tests in a process that did not register another backend"
        )
    rename_privateuse1_backend(NPU)


def _index(device: Any) -> int:
    if isinstance(device, int):
        return device
    parsed = torch.device(device)
    if parsed.type != NPU:
        raise ValueError(f"expected an npu device, got {device!r}")
    return 0 if parsed.index is None else parsed.index


class FakeNpuModule(types.ModuleType):
    """``torch.npu``: device queries answer from the configured count; ``synchronize`` counts."""

    def __init__(self, device_count: int, available: bool) -> None:
        super().__init__("torch.npu", "Emulated torch.npu (rr_fakes).")
        self._count, self._available = device_count, available
        self._current = 0
        self.synchronize_calls = 0

    def is_available(self) -> bool:
        return self._available and self._count > 0

    def device_count(self) -> int:
        return self._count if self._available else 0

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: Any) -> None:
        index = _index(device)
        if not 0 <= index < self.device_count():
            raise RuntimeError(f"invalid npu device {index}; {self.device_count()} visible")
        self._current = index

    def synchronize(self, device: Any = None) -> None:
        self.synchronize_calls += 1

    def is_initialized(self) -> bool:
        return self.is_available()

    def manual_seed(self, seed: int) -> None:
        return None

    def manual_seed_all(self, seed: int) -> None:
        return None


# ``torch.npu`` between emulations: the renamed backend's module, with no device.
_IDLE = FakeNpuModule(0, available=False)


@dataclass(frozen=True)
class GatingCall:
    """One recorded call of the fused gating op."""

    shape: tuple[int, ...]
    k: int
    kwargs: dict[str, Any]
    ids_TK: torch.Tensor


@dataclass
class EmulatedTorchNpu:
    """Handle of an installed emulation: the fake module, ``torch.npu`` and the calls."""

    module: types.ModuleType
    npu: FakeNpuModule
    gating_calls: list[GatingCall] = field(default_factory=list)


def _gating(calls: list[GatingCall]) -> Any:
    def npu_moe_gating_top_k(
        x: torch.Tensor,
        k: int,
        *,
        bias: torch.Tensor | None = None,
        k_group: int = 1,
        group_count: int = 1,
        group_select_mode: int = 0,
        renorm: int = 0,
        norm_type: int = 0,
        out_flag: bool = False,
        routed_scaling_factor: float = 1.0,
        eps: float = 1e-20,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Fused MoE gating (inference only): ``(weights_TK, ids_TK int32, scores_TE)``;
        ``norm_type`` 0 softmax, 1 sigmoid; ``bias`` shifts selection, not weights."""
        with torch.no_grad():
            scores_TE = torch.softmax(x.float(), -1) if norm_type == 0 else torch.sigmoid(x.float())
            select_TE = scores_TE if bias is None else scores_TE + bias.float()
            if group_count > 1:
                t, e = select_TE.shape
                grouped = select_TE.view(t, group_count, e // group_count)
                if group_select_mode == 0:
                    group_scores = grouped.max(-1).values
                else:
                    group_scores = grouped.topk(2, -1).values.sum(-1)
                keep = torch.zeros_like(group_scores, dtype=torch.bool)
                keep.scatter_(-1, group_scores.topk(k_group, -1).indices, True)
                mask_TE = keep.unsqueeze(-1).expand_as(grouped).reshape(t, e)
                select_TE = select_TE.masked_fill(~mask_TE, float("-inf"))
            ids_TK = select_TE.topk(k, -1).indices
            weights_TK = scores_TE.gather(-1, ids_TK)
            if norm_type == 1:
                weights_TK = weights_TK / (weights_TK.sum(-1, keepdim=True) + eps)
            weights_TK = (weights_TK * routed_scaling_factor).to(x.dtype)
            ids_TK = ids_TK.to(torch.int32)
        kwargs = {"bias": bias is not None, "k_group": k_group, "group_count": group_count}
        kwargs |= {"norm_type": norm_type, "renorm": renorm}
        calls.append(GatingCall(tuple(x.shape), k, kwargs, ids_TK.clone()))
        return weights_TK, ids_TK, scores_TE.to(x.dtype) if out_flag else None

    return npu_moe_gating_top_k


@contextmanager
def emulated_torch_npu(
    *, device_count: int = 8, available: bool = True, version: str = "2.13.0"
) -> Iterator[EmulatedTorchNpu]:
    """Install ``torch_npu`` and ``torch.npu`` emulations; remove both on exit (the backend
    rename stays, see the module doc)."""
    if "torch_npu" in sys.modules or getattr(torch, NPU, _IDLE) is not _IDLE:
        raise RuntimeError("torch_npu or torch.npu already present; the emulation needs neither")
    ensure_npu_backend_name()
    _unregister_npu_module()
    npu = FakeNpuModule(device_count, available)
    module = types.ModuleType("torch_npu", "Emulated torch_npu (rr_fakes).")
    handle = EmulatedTorchNpu(module=module, npu=npu)
    module.__version__ = version  # type: ignore[attr-defined]
    module.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
    module.npu = npu  # type: ignore[attr-defined]
    module.npu_moe_gating_top_k = _gating(handle.gating_calls)  # type: ignore[attr-defined]
    torch._register_device_module(NPU, npu)  # type: ignore[no-untyped-call]
    sys.modules["torch_npu"] = module
    try:
        yield handle
    finally:
        sys.modules.pop("torch_npu", None)
        if getattr(torch, NPU, None) is npu:
            _unregister_npu_module()
            torch._register_device_module(NPU, _IDLE)  # type: ignore[no-untyped-call]


def _unregister_npu_module() -> None:
    """Remove ``torch.npu`` and what torch cached from it (the device-module lookup and
    checkpoint's default device type), so no later query answers from a removed emulation."""
    if hasattr(torch, NPU):
        delattr(torch, NPU)
    sys.modules.pop("torch.npu", None)
    torch.get_device_module.cache_clear()
    checkpoint_default = torch.utils.checkpoint.DefaultDeviceType
    if checkpoint_default._default_device_type == NPU:
        checkpoint_default._default_device_type = None


_TRAP_MODULE = '''\
"""Stand-in for a torch_npu wheel installed without Huawei's CANN libraries."""

raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
'''


@contextmanager
def autoload_trap(directory: Path) -> Iterator[dict[str, str]]:
    """Write, under ``directory``, a ``torch_npu`` whose import fails as it does without CANN
    and the ``torch.backends`` entry point torch_npu declares; yield the environment additions
    (``PYTHONPATH``) under which a *subprocess*'s ``import torch`` then fails, unless
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` is also set. Nothing is written to site-packages."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "torch_npu.py").write_text(_TRAP_MODULE)
    dist = directory / "torch_npu-2.13.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [torch.backends]
            torch_npu = torch_npu:_autoload
            """
        )
    )
    try:
        yield {"PYTHONPATH": str(directory)}
    finally:
        (directory / "torch_npu.py").unlink(missing_ok=True)
        for path in dist.iterdir():
            path.unlink()
        dist.rmdir()
