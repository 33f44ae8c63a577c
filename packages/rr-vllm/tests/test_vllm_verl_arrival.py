"""rr's routes on arrival (``rr_vllm.verl.ARRIVAL``): where the switch has installed it, verl's
trainer hands its workers the batch with each sample's compact routes, and verl's training
worker expands them into verl's own jagged ``routed_experts`` as it receives them. Measured on
verl 0.9.1's own padding and data-parallel split (``chunk_tensordict``): what a worker gets
equals what verl's own path would have sent it, in a fraction of the bytes.

Skipped where verl cannot be imported (the ``verl`` nox session has it)."""

# ruff: noqa: F811 (the tests take the rollout tests' `verl` fixture, imported by name)

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import rr_vllm.verl as rollout
from rr_core import AlignmentError
from rr_vllm.verl import arrival
from test_vllm_verl_rollout import theirs_and_ours, trainer_batch, verl  # noqa: F401

#: (P, G) of six samples: verl's dispatch splits them evenly over two or three ranks.
SHAPES = [(5, 4), (3, 1), (7, 6), (2, 8), (6, 3), (4, 4)]


def sent_and_verls(verl: SimpleNamespace, shapes: list[tuple[int, int]], **kw: Any) -> tuple:
    """What the trainer sends its workers with rr switched on, and verl's own batch."""
    theirs, ours = theirs_and_ours(verl, shapes, **kw)
    want = trainer_batch(verl, theirs)
    rollout.ADAPTER.install()
    rollout.ARRIVAL.install()
    try:
        sent = trainer_batch(verl, ours)
    finally:
        rollout.ARRIVAL.uninstall()
        rollout.uninstall()
    return sent, want


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_each_rank_receives_verls_own_routes(verl: SimpleNamespace, ranks: int) -> None:
    from verl.utils.tensordict_utils import chunk_tensordict

    sent, want = sent_and_verls(verl, SHAPES)
    keys = set(sent.keys())
    assert rollout.FIELD in keys  # compact across Ray
    assert "routed_experts" not in keys
    for got, theirs in zip(
        chunk_tensordict(sent, ranks), chunk_tensordict(want, ranks), strict=True
    ):
        got = pickle.loads(pickle.dumps(got))  # what Ray's serializer hands the worker
        arrival.expand_on_arrival(got)
        assert rollout.FIELD not in got.keys()  # noqa: SIM118 (a TensorDict refuses `in`)
        a, b = theirs["routed_experts"], got["routed_experts"]
        assert b.dtype == a.dtype == torch.int16
        assert torch.equal(b.offsets(), a.offsets().to(torch.int64))
        assert torch.equal(b.values(), a.values())


def test_a_batch_that_does_not_fit_its_routes_is_refused_before_it_leaves(
    verl: SimpleNamespace,
) -> None:
    """Routes of another batch's sequences are refused in the trainer, not in a worker."""
    _, ours = theirs_and_ours(verl, SHAPES)
    ours.non_tensor_batch[rollout.FIELD] = ours.non_tensor_batch[rollout.FIELD][::-1].copy()
    rollout.ADAPTER.install()
    rollout.ARRIVAL.install()
    try:
        with pytest.raises(AlignmentError, match="sample 0"):
            trainer_batch(verl, ours)
    finally:
        rollout.ARRIVAL.uninstall()
        rollout.uninstall()


def test_without_the_arrival_side_the_trainer_sends_verls_tensor(
    verl: SimpleNamespace,
) -> None:
    _, ours = theirs_and_ours(verl, SHAPES)
    with_rollout_only = rollout.ADAPTER.install()
    assert with_rollout_only
    try:
        sent = trainer_batch(verl, ours)
    finally:
        rollout.uninstall()
    keys = set(sent.keys())
    assert "routed_experts" in keys
    assert rollout.FIELD not in keys


def test_the_training_worker_expands_what_it_is_handed(verl: SimpleNamespace) -> None:
    from rr_fakes.shims.megatron import megatron_cpu

    with megatron_cpu():
        from verl.workers import engine_workers
    worker = engine_workers.TrainingWorker
    originals = {e: vars(worker)[e] for e in arrival.ENTRIES}
    names = rollout.ARRIVAL.install()
    try:
        assert names == tuple(f"TrainingWorker.{e}" for e in arrival.ENTRIES)
        assert all(vars(worker)[e] is not originals[e] for e in arrival.ENTRIES)
        assert arrival.expands_in_workers()
    finally:
        rollout.ARRIVAL.uninstall()
    assert {e: vars(worker)[e] for e in arrival.ENTRIES} == originals
    assert not arrival.expands_in_workers()
    sent, want = sent_and_verls(verl, SHAPES)
    seen: dict[str, Any] = {}
    arrival._on_arrival(lambda data: seen.setdefault("data", data), None, (sent,), {})
    assert torch.equal(seen["data"]["routed_experts"].values(), want["routed_experts"].values())


@pytest.mark.parametrize(("codec", "share"), [("raw", 0.55), ("packed", 0.45), ("set", 0.35)])
def test_fewer_bytes_from_the_trainer_to_its_workers(
    verl: SimpleNamespace,
    codec: str,
    share: float,
) -> None:
    """The batch verl's trainer hands a worker, pickled, on a Qwen3-30B-A3B geometry (48
    layers, top-8 of 128): verl's jagged int16 rows (no padding left to save) against one
    payload per sample (raw: uint8 ids; packed: 7 bits an id; set: the rank of each row's set
    of 8 ids, about 40 bits)."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(num_hidden_layers=48, num_experts=128, num_experts_per_tok=8)
    shapes = [(40, 100), (64, 20), (10, 128), (33, 77)]
    sent, want = sent_and_verls(verl, shapes, codec=codec, lengths=(64, 128), config=config)
    routes = want["routed_experts"].values()
    routes_bytes = len(pickle.dumps(sent)) - len(pickle.dumps(want)) + routes.nbytes
    assert routes_bytes < share * routes.nbytes
