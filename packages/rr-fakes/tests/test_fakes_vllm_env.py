"""The CPU engine's settings ask for vLLM's V1 model runner only where the release has one:
vLLM 0.34 removed it and refuses ``VLLM_USE_V2_MODEL_RUNNER=0`` at start."""

from __future__ import annotations

import os

import pytest

from rr_fakes.shims import hf_checkpoints
from rr_fakes.shims.hf_checkpoints import MODEL_RUNNER_VARIABLE, set_vllm_cpu_env, vllm_cpu_env


@pytest.mark.parametrize("release", ["0.14.0", "0.30.0", "0.33.1"])
def test_v1_runner_below_0_34(release: str) -> None:
    assert vllm_cpu_env(release)[MODEL_RUNNER_VARIABLE] == "0"


@pytest.mark.parametrize("release", ["0.34.0", "0.34.1", "0.35.0rc1", "1.0.0"])
def test_no_runner_variable_from_0_34(release: str) -> None:
    env = vllm_cpu_env(release)
    assert MODEL_RUNNER_VARIABLE not in env, f"{release}: expected no {MODEL_RUNNER_VARIABLE}"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_installed_release_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_checkpoints, "installed_vllm_release", lambda: "0.34.0")
    assert MODEL_RUNNER_VARIABLE not in vllm_cpu_env()
    monkeypatch.setattr(hf_checkpoints, "installed_vllm_release", lambda: "0.30.0")
    assert vllm_cpu_env()[MODEL_RUNNER_VARIABLE] == "0"
    monkeypatch.setattr(hf_checkpoints, "installed_vllm_release", lambda: None)
    assert MODEL_RUNNER_VARIABLE not in vllm_cpu_env()


def test_set_env_on_0_34_leaves_the_variable_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODEL_RUNNER_VARIABLE, raising=False)
    for key in hf_checkpoints.VLLM_CPU_ENV:
        monkeypatch.delenv(key, raising=False)
    set_vllm_cpu_env("0.34.0")
    assert MODEL_RUNNER_VARIABLE not in os.environ
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    set_vllm_cpu_env("0.30.0")
    assert os.environ[MODEL_RUNNER_VARIABLE] == "0"


def test_set_env_refuses_a_v1_request_on_0_34(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODEL_RUNNER_VARIABLE, "0")
    with pytest.raises(ValueError, match=r"vLLM 0\.34\.0 has no V1 model runner"):
        set_vllm_cpu_env("0.34.0")
