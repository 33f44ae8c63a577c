"""The NPU section of ``rr doctor``: torch-npu, CANN, MindSpeed and what exactly is missing.

Imports neither torch nor torch_npu (an installed torch-npu without CANN can break
``import torch`` through torch's device-backend autoload). It reads package metadata, looks for
``torch_npu`` with ``importlib.util.find_spec`` (which does not execute it), looks for CANN's
``libhccl.so`` on disk, and, only when torch-npu is installed, checks ``import torch`` in a
subprocess so a broken autoload shows up here instead of in the user's training job.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rr_npu._supported import SUPPORTED

AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
CANN_HOME_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
HCCL_LIBRARY = "libhccl.so"
_DEFAULT_CANN_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend")


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _find_hccl() -> str | None:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for var in CANN_HOME_VARS:
        home = os.environ.get(var)
        if home:
            dirs += [home, f"{home}/lib64", f"{home}/runtime/lib64"]
    dirs += [f"{root}/{sub}" for root in _DEFAULT_CANN_ROOTS for sub in ("lib64", "runtime/lib64")]
    for directory in dirs:
        candidate = Path(directory) / HCCL_LIBRARY
        if candidate.exists():
            return str(candidate)
    return None


def _import_torch_in_subprocess() -> tuple[bool, str]:
    """Does ``import torch`` work in a fresh interpreter with this environment?"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import torch"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"{type(error).__name__}: {error}"
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return done.returncode == 0, lines[-1] if lines else ""


def npu_report() -> dict[str, Any]:
    """The NPU view as data; ``missing`` lists what stops NPU use, each with its fix."""
    torch_npu_version = _version("torch-npu") or _version("torch_npu")
    report: dict[str, Any] = {
        "torch-npu": torch_npu_version,
        "supported": SUPPORTED["torch-npu"],
        "mindspeed": _version("mindspeed"),
        "torch_npu_importable_path": None,
        "libhccl": None,
        AUTOLOAD_VAR: os.environ.get(AUTOLOAD_VAR),
        "import_torch_ok": None,
        "missing": [],
    }
    missing: list[str] = report["missing"]
    if torch_npu_version is None:
        missing.append("torch-npu is not installed (only needed on Ascend machines)")
        return report
    spec = importlib.util.find_spec("torch_npu")
    report["torch_npu_importable_path"] = None if spec is None else spec.origin
    if spec is None:
        missing.append("torch-npu metadata is present but no torch_npu module is on sys.path")
    report["libhccl"] = _find_hccl()
    if report["libhccl"] is None:
        missing.append(
            f"CANN: {HCCL_LIBRARY} not found (LD_LIBRARY_PATH, {', '.join(CANN_HOME_VARS)}); "
            "install CANN and source its set_env.sh, or torch_npu fails with "
            f"'ImportError: {HCCL_LIBRARY}'"
        )
    ok, detail = _import_torch_in_subprocess()
    report["import_torch_ok"] = ok
    if not ok:
        missing.append(
            f"`import torch` fails in this environment ({detail}): torch-npu's device-backend "
            f"autoload runs on import; set {AUTOLOAD_VAR}=0 until CANN is present"
        )
    elif report["libhccl"] is None and os.environ.get(AUTOLOAD_VAR) != "0":
        missing.append(
            f"set {AUTOLOAD_VAR}=0 on machines without CANN so torch does not autoload torch_npu"
        )
    return report


def render(report: dict[str, Any]) -> str:
    if report["torch-npu"] is None:
        return f"torch-npu  not installed (supported {report['supported']}); NPU backend unused"
    lines = [
        f"torch-npu  {report['torch-npu']}  (supported {report['supported']})",
        f"mindspeed  {report['mindspeed'] or 'not installed'}",
        f"torch_npu module  {report['torch_npu_importable_path'] or 'not found'}",
        f"CANN {HCCL_LIBRARY}  {report['libhccl'] or 'NOT FOUND'}",
        f"{AUTOLOAD_VAR}  {report[AUTOLOAD_VAR] or 'unset'}",
        f"import torch  {'ok' if report['import_torch_ok'] else 'FAILS'}",
    ]
    if report["missing"]:
        lines += ["missing:", *(f"  - {item}" for item in report["missing"])]
    return "\n".join(lines)


def section() -> tuple[dict[str, Any], str]:
    """This view as a section of ``rr doctor`` (entry point ``rr.doctor``)."""
    report = npu_report()
    return report, render(report)
