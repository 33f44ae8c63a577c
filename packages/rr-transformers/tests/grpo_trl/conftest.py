"""The TRL tests: TRL's own GRPOTrainer on vLLM's CPU build (the ``trl`` session installs
both). Skipped where trl or a CPU vLLM engine is missing; the per-step table of the GRPO runs
is printed in the terminal summary."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

set_vllm_cpu_env()  # before vllm is imported
sys.path.insert(0, str(Path(__file__).parent))  # grpo_runs, beside the tests

pytest.importorskip("trl", reason="trl is not installed (nox -s trl)", exc_type=ImportError)
pytest.importorskip("vllm", reason="vllm is not installed (nox -s trl)", exc_type=ImportError)


@pytest.fixture(scope="session")
def engines() -> Iterator[Any]:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("these tests run vLLM's CPU build (vllm-cpu)")
    import grpo_runs

    with grpo_runs.session() as pool:
        yield pool


def pytest_terminal_summary(terminalreporter: Any) -> None:
    runs = sys.modules.get("grpo_runs")
    if runs is not None and runs.TABLE:
        terminalreporter.write_sep("=", "TRL GRPOTrainer + vLLM colocate (vllm-cpu), per step")
        terminalreporter.write_line(runs.table())
