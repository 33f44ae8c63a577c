"""The device abstraction and the doctor section.

Real-world failures guarded against: an installed torch-npu without CANN breaking
``import torch`` through the device-backend autoload (so nothing may import torch_npu as a side
effect, and ``rr doctor`` must say what is missing); a device decision frozen at import time
that ignores a later opt-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rr_npu
from rr_npu_testing import in_fresh_process


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env=full,
        check=False,
    )


def test_import_rr_npu_imports_neither_torch_nor_torch_npu() -> None:
    """A bare ``import rr_npu`` (and the doctor module) must not touch torch / torch_npu."""
    done = _python(
        """
        import sys, rr_npu, rr_npu._doctor
        rr_npu.SUPPORTED
        print(sorted(m for m in ("torch", "torch_npu") if m in sys.modules))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_device_choice_is_evaluated_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice follows RR_DEVICE at call time, not at import time."""
    monkeypatch.delenv("RR_DEVICE", raising=False)
    assert rr_npu.device_choice().device_type == "cpu"
    assert rr_npu.collective_backend() == "gloo"
    monkeypatch.setenv("RR_DEVICE", "cuda")
    choice = rr_npu.device_choice()
    assert (choice.backend, choice.visible_devices_var) == ("nccl", "CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("RR_DEVICE", "tpu")
    with pytest.raises(ValueError, match="tpu"):
        rr_npu.device_choice()


def test_npu_opt_in_without_torch_npu_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for npu where torch_npu cannot load is an ImportError with the CANN fix."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import fails as if absent
    with pytest.raises(rr_npu.NpuUnavailableError, match="TORCH_DEVICE_BACKEND_AUTOLOAD"):
        rr_npu.device_choice("npu")


@in_fresh_process
def test_emulated_npu_gives_hccl_and_ascend_visibility(monkeypatch: pytest.MonkeyPatch) -> None:
    """With (emulated) torch_npu loaded: npu:N parses, hccl, ASCEND_RT_VISIBLE_DEVICES."""
    from rr_fakes import emulated_torch_npu

    monkeypatch.delenv("RR_DEVICE", raising=False)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    assert rr_npu.device_type() == "cpu"
    with emulated_torch_npu(device_count=2):
        choice = rr_npu.device_choice()
        assert (choice.device_type, choice.backend) == ("npu", "hccl")
        assert choice.visible_devices_var == "ASCEND_RT_VISIBLE_DEVICES"
        assert choice.visible_devices() == "0,1"
        assert str(choice.device(1)) == "npu:1"
        assert rr_npu.device_choice("npu").backend == "hccl"
    with emulated_torch_npu(available=False):
        assert rr_npu.device_type() == "cpu"
        with pytest.raises(rr_npu.NpuUnavailableError, match="no available device"):
            rr_npu.device_choice("npu")
    assert rr_npu.device_type() == "cpu"


def test_doctor_section_with_torch_npu_but_no_cann(tmp_path: Path) -> None:
    """torch-npu installed, no CANN: ``import torch`` breaks through autoload; the section says
    exactly what is missing (libhccl, the autoload variable) without importing either."""
    from rr_fakes import autoload_trap

    code = """
        import json, sys
        from rr_npu._doctor import section
        data, text = section()
        assert "torch" not in sys.modules and "torch_npu" not in sys.modules
        print(json.dumps({"data": data, "text": text}))
        """
    with autoload_trap(tmp_path / "trap") as env:
        env = {**env, "LD_LIBRARY_PATH": "", "ASCEND_HOME_PATH": str(tmp_path / "none")}
        broken = _python(code, env)
        fixed = _python(code, {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert broken.returncode == 0, broken.stderr
    report = json.loads(broken.stdout)
    data, text = report["data"], report["text"]
    assert data["torch-npu"] == "2.13.0"
    assert data["libhccl"] is None
    assert data["import_torch_ok"] is False
    assert "libhccl.so" in text
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text
    assert "import torch  FAILS" in text
    fixed_data = json.loads(fixed.stdout)["data"]
    assert fixed_data["import_torch_ok"] is True
    assert any("libhccl.so" in item for item in fixed_data["missing"])


def test_doctor_section_is_registered() -> None:
    from importlib.metadata import entry_points

    names = {e.name: e.value for e in entry_points(group="rr.doctor")}
    assert names.get("npu") == "rr_npu._doctor:section"
    from rr_npu._doctor import section

    data, text = section()
    assert "torch-npu" in text
    assert data["supported"] == rr_npu.SUPPORTED["torch-npu"]
