"""The emulated torch_npu reproduces the documented device, collective and gating behaviour."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rr_fakes.emulations.torch_npu import (
    HCCL_COLLECTIVE_DTYPES,
    autoload_trap,
    check_hccl_dtype,
    emulated_torch_npu,
)


def test_npu_device_parses_but_cannot_allocate() -> None:
    with emulated_torch_npu(device_count=2) as emu:
        assert torch.device("npu:1").type == "npu"
        assert importlib.import_module("torch_npu") is emu.module
        assert torch.npu is emu.npu  # type: ignore[attr-defined]
        with pytest.raises(NotImplementedError):
            torch.empty(2, device="npu:0")
    assert "torch_npu" not in sys.modules
    assert torch.npu is not emu.npu  # type: ignore[attr-defined]
    assert not torch.npu.is_available()  # type: ignore[attr-defined]
    assert torch.npu.device_count() == 0  # type: ignore[attr-defined]
    assert torch.device("npu:0").type == "npu"  # the rename is once per process


def test_torch_accelerator_queries_work_after_the_emulation() -> None:
    with emulated_torch_npu(device_count=2):
        assert torch.get_device_module("npu").is_available()
    assert torch.accelerator.current_accelerator(check_available=True) is None
    x = torch.ones(3, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False)
    y.sum().backward()  # checkpoint asks torch for the accelerator on every call
    assert torch.allclose(x.grad, torch.cos(x.detach()))


def test_fake_device_module() -> None:
    with emulated_torch_npu(device_count=2) as emu:
        npu = emu.npu
        assert npu.is_available()
        assert npu.device_count() == 2
        npu.set_device("npu:1")
        assert npu.current_device() == 1
        npu.set_device(torch.device("npu", 0))
        assert npu.current_device() == 0
        with pytest.raises(RuntimeError, match="invalid npu device 2"):
            npu.set_device(2)
        npu.synchronize()
        assert npu.synchronize_calls == 1
    with emulated_torch_npu(available=False) as emu:
        assert not emu.npu.is_available()
        assert emu.npu.device_count() == 0


def test_reentry_and_double_install() -> None:
    with (
        emulated_torch_npu(),
        pytest.raises(RuntimeError, match="already present"),
        emulated_torch_npu(),
    ):
        pass
    with emulated_torch_npu():
        pass


def test_hccl_dtype_table() -> None:
    for ok in (torch.int16, torch.uint8, torch.int32, torch.bfloat16):
        assert ok in HCCL_COLLECTIVE_DTYPES
        check_hccl_dtype(ok)
    for bad in (torch.uint16, torch.uint32, torch.uint64):
        with pytest.raises(RuntimeError, match="HCCL does not support"):
            check_hccl_dtype(bad)


def test_gating_top_k_returns_int32_and_records_calls() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 16)
    with emulated_torch_npu() as emu:
        import torch_npu

        weights, ids, scores = torch_npu.npu_moe_gating_top_k(x, 4, out_flag=True)
        assert ids.dtype == torch.int32
        assert ids.shape == (5, 4)
        assert torch.equal(ids.long(), torch.softmax(x, -1).topk(4).indices)
        assert torch.allclose(weights, scores.gather(-1, ids.long()))
        grouped = torch_npu.npu_moe_gating_top_k(x, 2, k_group=1, group_count=4, norm_type=1)[1]
        group_TK = grouped.long() // 4
        assert torch.equal(group_TK[:, 0], group_TK[:, 1])  # k_group=1: both ids in one group
        assert [call.k for call in emu.gating_calls] == [4, 2]
        assert emu.gating_calls[1].kwargs["group_count"] == 4
        x.requires_grad_(True)
        assert not torch_npu.npu_moe_gating_top_k(x, 2)[0].requires_grad  # inference only


def test_gating_has_no_forced_ids() -> None:
    with emulated_torch_npu() as emu, pytest.raises(TypeError):
        emu.module.npu_moe_gating_top_k(torch.randn(2, 4), 2, expert_ids=torch.zeros(2, 2))


def _import_torch(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=120
    )


def test_installed_torch_npu_without_cann_breaks_import_torch(tmp_path: Path) -> None:
    with autoload_trap(tmp_path / "site") as env:
        broken = _import_torch(env)
        assert broken.returncode != 0
        assert "Failed to load the backend extension: torch_npu" in broken.stderr
        assert "libhccl.so" in broken.stderr
        assert _import_torch({**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}).returncode == 0
