"""rr's verl rollout side as it is installed into verl's processes: install and uninstall give
verl's own classes and functions back, verl modules that copied them by name are hooked again,
and the agent-loop worker class verl's trainer ships to Ray's worker processes arrives
compacting (Ray copies an actor class's methods into the class it pickles, so rr subclasses
verl's worker rather than wrapping its method) or, where that process has no rr, as verl's.

Skipped where verl cannot be imported (the ``verl`` nox session has it)."""

# ruff: noqa: F811 (the tests take the rollout tests' `verl` fixture, imported by name)

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

import rr_vllm.verl as rollout
from rr_core import ReplayController, ReplayError
from rr_fakes.shims import verl as harness
from rr_vllm import VerlRoutes
from test_vllm_verl_rollout import SHAPES, outputs, rr, verl  # noqa: F401


def test_install_is_idempotent_and_uninstall_gives_verl_back(verl: SimpleNamespace) -> None:
    worker = verl.agent_loop.AgentLoopWorker
    original = (verl.padding.left_right_2_no_padding, worker)
    names = rollout.ADAPTER.install()
    assert rollout.ADAPTER.install() == names
    assert rollout.is_installed()
    assert any(n.endswith("agent_loop.AgentLoopWorker") for n in names)
    ours = verl.agent_loop.AgentLoopWorker
    assert issubclass(ours, worker)
    assert ours is not worker
    assert "_agent_loop_postprocess" in vars(ours)
    assert rollout.uninstall() >= 2
    assert not rollout.is_installed()
    assert verl.padding.left_right_2_no_padding is original[0]
    assert verl.agent_loop.AgentLoopWorker is original[1]
    with pytest.raises(ReplayError, match="no routers"):
        rollout.attach(ReplayController(num_experts=8, top_k=2), torch.nn.Linear(1, 1))


def test_the_compacting_worker_travels_to_rays_worker_processes(verl: SimpleNamespace) -> None:
    """verl's trainer ships the agent-loop worker class with ``ray.remote``: Ray copies the
    class's methods into the class it pickles (its tracing wrappers), so a patch on verl's
    method would arrive as verl's bare function; rr's subclass arrives compacting."""
    import ray.cloudpickle
    from ray.actor import _modify_class
    from ray.util.tracing.tracing_helper import _inject_tracing_into_class

    with rr():
        shipped = _modify_class(verl.agent_loop.AgentLoopWorker)
        _inject_tracing_into_class(shipped)  # what Ray does before it pickles the class
        arrived = ray.cloudpickle.loads(ray.cloudpickle.dumps(shipped))
        worker = object.__new__(arrived)
        vars(worker).update(
            vars(harness.agent_loop_worker(verl.config, prompt_length=8, response_length=9))
        )
        proto = harness.agent_loop_batch(worker, outputs(verl, SHAPES))
    assert "routed_experts" not in proto.batch.keys()  # noqa: SIM118 (a TensorDict refuses `in`)
    assert all(isinstance(p, VerlRoutes) for p in proto.non_tensor_batch[rollout.FIELD])


def test_the_compacting_worker_passes_through_where_rr_is_not_installed(
    verl: SimpleNamespace,
) -> None:
    """The class reaches a worker process whether or not that process switched rr on; without
    rr there it leaves verl's own path, whose int16 routes verl's trainer reads as ever."""
    with rr():
        ours = verl.agent_loop.AgentLoopWorker
    worker = object.__new__(ours)
    vars(worker).update(
        vars(harness.agent_loop_worker(verl.config, prompt_length=8, response_length=9))
    )
    proto = harness.agent_loop_batch(worker, outputs(verl, SHAPES))
    assert "routed_experts" in proto.batch.keys()  # noqa: SIM118 (a TensorDict refuses `in`)
    assert rollout.FIELD not in proto.non_tensor_batch


def test_a_copy_imported_while_installed_is_hooked_again_after_a_reinstall(
    verl: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verl module imported while rr was installed (``from ... import``) holds that install's
    proxy, which passes through once uninstalled; the next install hooks that copy too (else
    verl's trainer would get no routed_experts from rr's compact routes)."""
    probe = types.ModuleType("verl.rr_probe")
    monkeypatch.setitem(sys.modules, probe.__name__, probe)
    original = verl.padding.left_right_2_no_padding
    try:
        rollout.ADAPTER.install()
        probe.left_right_2_no_padding = verl.padding.left_right_2_no_padding  # imported now
        rollout.uninstall()
        assert probe.left_right_2_no_padding is not original  # the stale, passing proxy
        rollout.ADAPTER.install()
        assert probe.left_right_2_no_padding is verl.padding.left_right_2_no_padding
    finally:
        rollout.uninstall()
    assert verl.padding.left_right_2_no_padding is original
