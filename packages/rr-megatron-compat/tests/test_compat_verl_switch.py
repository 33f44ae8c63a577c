"""``rr_megatron_compat.verl.install()``, the one switch, in a fresh interpreter with the real
verl 0.9.1: it imports no verl module, each side present (Megatron here, FSDP from
rr-transformers, rollout from rr-vllm) is installed exactly when the process imports its verl
module, verl's Megatron engine imported afterwards binds rr's names, and after ``uninstall()`` a
later import installs nothing. The per-package installs warn that they are deprecated."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("rr_transformers")
pytest.importorskip("rr_vllm")

import rr_megatron_compat.verl as rv
from rr_fakes.shims.ray_tmp import ray_tmpdir

PROBE = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    import torch
    out = {"torch_seconds": time.perf_counter() - started}
    started = time.perf_counter()
    import rr_megatron_compat.verl as rv
    out["returned"] = list(rv.install())
    out["hook_seconds"] = time.perf_counter() - started
    out["verl_imported_by_install"] = sorted(m for m in sys.modules if m.split(".")[0] == "verl")
    sides = rv.sides()

    def state():
        return {
            name: [side.installer.is_installed(), any(m in sys.modules for m in side.verl_modules)]
            for name, side in sides.items()
        }

    out["sides"] = sorted(sides)
    out["steps"] = [("installed", state())]
    import verl.trainer.main_ppo  # the task runner's imports (the padding module among them)
    out["steps"].append(("main_ppo imported", state()))
    rv.uninstall()
    import verl.experimental.agent_loop.agent_loop
    out["imported_while_off"] = state()
    out["returned_again"] = list(rv.install())
    out["steps"].append(("installed again", state()))
    import verl.workers.engine.fsdp.transformer_impl
    out["steps"].append(("fsdp engine imported", state()))
    from rr_fakes.shims.megatron import megatron_cpu
    with megatron_cpu():  # Megatron's modules import on the CPU
        from verl.workers.engine.megatron import transformer_impl as megatron_engine
    out["steps"].append(("megatron engine imported", state()))
    with megatron_cpu():
        import verl.workers.engine_workers  # the training worker, where the routes arrive
    out["steps"].append(("engine workers imported", state()))
    out["engine_binds_rr"] = megatron_engine.set_router_replay_data is rv.set_router_replay_data
    out["is_installed"] = rv.is_installed()
    out["removed"] = rv.uninstall()
    out["after_uninstall"] = state()
    out["is_installed_after"] = rv.is_installed()
    print("PROBE " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE "))
    return dict(json.loads(line.removeprefix("PROBE ")))


def test_install_imports_no_verl_module_and_finds_every_side(probe: dict[str, Any]) -> None:
    assert probe["verl_imported_by_install"] == []
    assert probe["returned"] == []  # nothing of verl's was there to patch yet
    assert probe["sides"] == ["fsdp", "megatron", "rollout", "rollout-arrival"]


def test_each_side_is_installed_exactly_when_its_verl_module_is_imported(
    probe: dict[str, Any],
) -> None:
    for step, state in probe["steps"]:
        for side, (installed, imported) in state.items():
            assert installed == imported, (step, side)
    assert all(installed for installed, _ in probe["steps"][-1][1].values())
    assert probe["is_installed"]


def test_verls_task_runner_imports_with_the_switch_on(probe: dict[str, Any]) -> None:
    """``main_ppo`` imports verl's padding while ``verl.trainer.distillation`` is half
    initialised: the rollout side waits for the agent loop (its install imports it, which
    imports distillation), so the job starts; the side installs when the agent loop comes."""
    steps = dict(probe["steps"])
    assert steps["main_ppo imported"]["rollout"] == [False, False]


def test_a_megatron_engine_imported_after_install_calls_rr(probe: dict[str, Any]) -> None:
    assert probe["engine_binds_rr"]


def test_an_import_after_uninstall_installs_nothing_and_install_then_hooks_it_at_once(
    probe: dict[str, Any],
) -> None:
    rollout_installed, agent_loop_imported = probe["imported_while_off"]["rollout"]
    assert agent_loop_imported
    assert not rollout_installed
    assert "verl.workers.utils.padding.left_right_2_no_padding" in probe["returned_again"]


def test_uninstall_takes_every_side_out(probe: dict[str, Any]) -> None:
    assert probe["removed"] > 0
    assert not probe["is_installed_after"]
    assert not any(installed for installed, _ in probe["after_uninstall"].values())


def test_the_per_package_installs_are_deprecated_and_still_install() -> None:
    import rr_transformers
    import rr_transformers.verl as fsdp
    import rr_vllm.verl as rollout

    try:
        with pytest.warns(DeprecationWarning, match=r"rr_megatron_compat\.verl\.install\(\)"):
            fsdp.install()
        with pytest.warns(DeprecationWarning, match=r"rr_megatron_compat\.verl\.install\(\)"):
            rollout.install()
        assert fsdp.is_installed()
        assert rollout.is_installed()
    finally:
        fsdp.uninstall()
        rr_transformers.uninstall()
        rollout.uninstall()


def test_the_switch_checks_verls_release_once_for_every_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    from rr_core.verl_release import VerlReleaseError

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.0")
    with pytest.raises(VerlReleaseError, match=r"verl 0\.11\.0 is outside the tested range"):
        rv.install()
    assert not rv.is_installed()


RAY_PROBE = textwrap.dedent(
    """
    import json, sys
    import ray

    @ray.remote
    def worker_state():
        import rr_megatron_compat.verl as switch_in_worker

        state = {
            "switched": switch_in_worker.is_installed(),
            "verl_modules": sorted(m for m in sys.modules if m.split(".")[0] == "verl"),
        }
        import verl.experimental.agent_loop.agent_loop  # the rollout side's module

        state["rollout"] = switch_in_worker.sides()["rollout"].installer.is_installed()
        return state

    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": "rr_megatron_compat.verl.install"},
    )
    try:
        print("RAY " + json.dumps(ray.get(worker_state.remote(), timeout=240)), flush=True)
    finally:
        ray.shutdown()
    """
)


def test_ray_runs_the_switch_as_each_workers_setup_hook(tmp_path: Path) -> None:
    """As a verl job states it (``ray_kwargs.ray_init.runtime_env.worker_process_setup_hook``):
    Ray calls the switch in its worker before any task, the worker has imported no verl module,
    and the side whose module a task then imports is in place.

    The driver is a process of its own (as a job's is) in a session of its own, killed with
    Ray's daemons if it overruns; Ray's files go outside the virtualenv (``ray_tmpdir``)."""
    pytest.importorskip("ray")
    ray_temp = ray_tmpdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(ray_temp)}
    out = tmp_path / "driver.log"
    try:
        with out.open("w") as log:
            driver = subprocess.Popen(
                [sys.executable, "-c", RAY_PROBE],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = driver.wait(timeout=420)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(driver.pid, signal.SIGKILL)  # Ray's daemons left behind, if any
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    printed = out.read_text()
    assert returncode == 0, printed[-4000:]
    line = next(x for x in printed.splitlines() if x.startswith("RAY "))
    state = json.loads(line.removeprefix("RAY "))
    assert state == {"switched": True, "verl_modules": [], "rollout": True}
