"""Multi-process runs on gloo: PP=2 (also with VPP), EP=2 with both dispatchers, and the
launcher's failure handling."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch.distributed as dist

from rr_core import walk_routers
from rr_fakes.shims.megatron import (
    ParallelSizes,
    RankFailedError,
    TinyGPTConfig,
    build_gpt,
    build_gpt_chunks,
    gpt_inputs,
    launch,
    train_step,
)


def pipeline_rank(num_layers: int) -> tuple[int, list[int], int, bool]:
    from megatron.core import parallel_state as ps

    chunks = build_gpt_chunks(TinyGPTConfig(num_layers=num_layers, mtp_num_layers=1))
    layers = [layer for layer, _ in walk_routers(chunks)]
    losses = train_step(chunks, [gpt_inputs(1, 8, 64, seed=i) for i in range(4)])
    params = [p for chunk in chunks for p in chunk.parameters() if p.requires_grad]
    return (
        ps.get_pipeline_model_parallel_rank(),
        layers,
        len(losses),
        all(p.grad is not None for p in params),
    )


def test_pp2_1f1b_splits_layers_by_stage_and_trains() -> None:
    results = launch(pipeline_rank, 2, 4, sizes=ParallelSizes(pp=2))
    assert results == [(0, [1, 2], 0, True), (1, [3, 4], 4, True)]


def test_A3_pp2_vpp2_interleaved_chunks_carry_global_layer_numbers() -> None:
    results = launch(pipeline_rank, 2, 8, sizes=ParallelSizes(pp=2, vpp=2))
    assert results == [(0, [1, 2, 5, 6], 0, True), (1, [3, 4, 7, 8], 4, True)]


def expert_rank(dispatcher: str) -> tuple[int, int, list[int], bool]:
    from megatron.core import parallel_state as ps

    model = build_gpt(TinyGPTConfig(dispatcher=dispatcher, aux_loss_coeff=0.01))  # type: ignore[arg-type]
    experts: Any = model.decoder.layers[0].mlp.experts
    losses = train_step([model], [gpt_inputs(2, 8, 64, seed=ps.get_data_parallel_rank())])
    routers = [router for _, router in walk_routers(model)]
    return (
        ps.get_expert_model_parallel_rank(),
        len(list(experts.local_experts)),
        [layer for layer, _ in walk_routers(model)],
        len(losses) == 1 and all(r.weight.grad is not None for r in routers),
    )


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_ep2_holds_half_the_experts_per_rank_and_trains(dispatcher: str) -> None:
    results = launch(expert_rank, 2, dispatcher, sizes=ParallelSizes(ep=2))
    assert results == [(0, 4, [1, 2, 3, 4], True), (1, 4, [1, 2, 3, 4], True)]


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one exploded")
    dist.barrier()


def test_a_failing_rank_fails_the_launch_with_its_traceback() -> None:
    with pytest.raises(RankFailedError, match="rank one exploded") as info:
        launch(fail_on_rank_one, 2, timeout_s=60)
    assert info.value.rank == 1
    assert "fail_on_rank_one" in info.value.detail


def hang_and_report_pid(path: str) -> None:
    with open(f"{path}.{dist.get_rank()}", "w") as out:
        out.write(str(os.getpid()))
    time.sleep(600)


def test_a_hung_launch_times_out_and_leaves_no_process(tmp_path: Any) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        launch(hang_and_report_pid, 2, str(tmp_path / "pid"), timeout_s=15)
    assert time.monotonic() - started < 40
    pids = [int((tmp_path / f"pid.{rank}").read_text()) for rank in range(2)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def pipeline_expert_rank() -> tuple[int, int, list[int], int]:
    from megatron.core import parallel_state as ps

    model = build_gpt(TinyGPTConfig())
    experts: Any = model.decoder.layers[0].mlp.experts
    train_step([model], [gpt_inputs(1, 8, 64, seed=i) for i in range(2)])
    return (
        ps.get_pipeline_model_parallel_rank(),
        ps.get_expert_model_parallel_rank(),
        [layer for layer, _ in walk_routers(model)],
        len(list(experts.local_experts)),
    )


def test_world_of_four_pp2_ep2() -> None:
    results = launch(pipeline_expert_rank, 4, sizes=ParallelSizes(pp=2, ep=2), timeout_s=240)
    assert sorted(results) == [
        (0, 0, [1, 2], 4),
        (0, 1, [1, 2], 4),
        (1, 0, [3, 4], 4),
        (1, 1, [3, 4], 4),
    ]


def world_size_seen() -> int:
    return dist.get_world_size()


def test_a_rendezvous_port_taken_before_rank_0_binds_it_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parallel test workers may bind the port the OS called free before rank 0 listens on
    it (EADDRINUSE): the launch runs again on another port instead of failing the test."""
    import socket

    from rr_fakes.shims.megatron import _dist, _launch

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy])
    tried: list[int] = []

    def next_port() -> int:
        port = next(ports, None) or _dist.free_port()
        tried.append(port)
        return port

    monkeypatch.setattr(_launch, "free_port", next_port)
    with taken:
        assert launch(world_size_seen, 2) == [2, 2]
    assert tried[0] == busy
    assert len(tried) == 2
    assert tried[1] != busy
