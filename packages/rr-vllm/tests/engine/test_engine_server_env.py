"""The ``vllm serve`` harness's variables: the V1 model runner only below vLLM 0.34 (0.34
removed it and refuses ``VLLM_USE_V2_MODEL_RUNNER=0``), the engine core's multiprocessing left
to vLLM."""

from __future__ import annotations

import pytest
from engine_server import server_env

VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"


@pytest.mark.parametrize("release", ["0.34.0", "0.35.0"])
def test_no_v1_runner_from_0_34(release: str) -> None:
    env = server_env({VARIABLE: "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HOME": "/h"}, release)
    assert VARIABLE not in env, f"vLLM {release}: expected no {VARIABLE}, got {env.get(VARIABLE)}"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["HOME"] == "/h"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_v1_runner_below_0_34() -> None:
    env = server_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "0.30.0")
    assert env[VARIABLE] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
