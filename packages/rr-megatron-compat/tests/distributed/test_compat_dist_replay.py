"""Replay across real multi-process Megatron layouts on two gloo ranks: R3 replay through a
PP=2 1F1B pipeline (A3), duplicate expert ids through the EP=2 alltoall dispatcher (C1),
and per-micro-batch targets through Megatron's activation recompute under the PP=2 x VPP=2
interleaved schedule (B1).

Each rank function runs in a spawned process and returns plain data (tensors as lists)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch

E, K = 8, 2
BATCH, SEQ, VOCAB = 2, 8, 64
T = BATCH * SEQ
TIMEOUT_S = 300  # hard limit per launch; a loaded machine is slow, a hang is not
PP_FREQ = [1, 0, 1, 1]  # PP=2: stage 0 holds MoE layer 1, stage 1 MoE layers 3 and 4
VPP_FREQ = [0, 1, 1, 0, 1, 0, 1, 1]  # PP=2 x VPP=2: MoE layers 2, 3, 5, 7, 8 over 4 chunks

launch = pytest.importorskip("rr_fakes.shims.megatron").launch


def megatron_available() -> bool:
    """Checked when a test runs, not at import: spawned ranks re-import this module."""
    from rr_fakes.shims.megatron import unavailable_reason

    return unavailable_reason() is None


@pytest.fixture(autouse=True)
def _needs_megatron() -> None:
    if not megatron_available():
        pytest.skip("megatron-core unavailable")


# -- per-rank steps (run inside launched ranks) ----------------------------------------------------


def build_chunks(recompute: bool = False, **kw: Any) -> list[torch.nn.Module]:
    """This rank's model chunks with the replay flag set on the config where the line has one
    (what ``enable_replay`` does)."""
    import rr_megatron_compat as rmc
    from rr_fakes.shims.megatron import RECOMPUTE, TinyGPTConfig, build_gpt_chunks

    extra = dict(kw.pop("extra", {}))
    if recompute:
        extra.update(RECOMPUTE)
    extra.update(rmc.replay_config_fields())
    chunks = build_gpt_chunks(TinyGPTConfig(extra=extra, **kw))
    for chunk in chunks:
        assert rmc.replay_enabled(chunk.config)
    return chunks


def copy_weights(source: Sequence[torch.nn.Module], target: Sequence[torch.nn.Module]) -> None:
    for a, b in zip(source, target, strict=True):
        b.load_state_dict(a.state_dict())


def microbatches(n: int, seed: int = 0) -> list[dict[str, Any]]:
    from rr_fakes.shims.megatron import gpt_inputs

    return [gpt_inputs(BATCH, SEQ, VOCAB, seed=seed + i) for i in range(n)]


def run_step(
    chunks: Sequence[torch.nn.Module],
    batches: Sequence[Mapping[str, Any]],
    controller: Any = None,
) -> list[float]:
    """Megatron's forward-backward schedule for this layout (1F1B, or interleaved with VPP);
    each forward runs inside ``controller.microbatch(mb)`` with its output tracked."""
    from rr_fakes.shims.megatron import train_step

    return train_step(chunks, batches, controller)


@contextlib.contextmanager
def capture_ids(
    chunks: Sequence[torch.nn.Module],
) -> Iterator[dict[str, dict[int, list[list[list[int]]]]]]:
    """Per layer, the expert ids of every routing map its router returned, in call order: under
    ``forward`` for forwards, ``recompute`` for Megatron's recompute inside backward. Per layer
    both come in micro-batch order (the schedules run each chunk's micro-batches in order)."""
    from rr_fakes.shims.megatron import route_log

    seen: dict[str, dict[int, list[list[list[int]]]]] = {}
    with route_log(chunks) as log:
        yield seen
    seen.update(log.id_lists())


def replay_armed(
    controller: Any,
    chunks: Sequence[torch.nn.Module],
    armed: Sequence[torch.Tensor],
    layer_numbers: Sequence[int],
) -> None:
    """Set ``controller`` to replay ``armed[mb]`` in micro-batch ``mb`` and clear the chunks'
    gradients for the step."""
    from rr_core import ReplayMode

    controller.set_mode(ReplayMode.REPLAY)
    for mb, routes in enumerate(armed):
        controller.arm(mb, routes, layer_numbers=layer_numbers)
    for chunk in chunks:
        chunk.zero_grad(set_to_none=True)


def sorted_rows(routes_TK: torch.Tensor) -> list[list[int]]:
    """The id set of each row, as the routing map holds it (a repeated id collapses)."""
    return [sorted(set(row)) for row in routes_TK.tolist()]


def router_grads(chunks: Sequence[torch.nn.Module]) -> dict[int, float]:
    from rr_core import walk_routers

    out = {}
    for layer, router in walk_routers(list(chunks)):
        grad = getattr(router.weight, "main_grad", None)
        grad = router.weight.grad if grad is None else grad
        out[layer] = -1.0 if grad is None else float(grad.abs().sum())
    return out


def distinct_targets(mb: int, layers: int, seed: int) -> torch.Tensor:
    """``[T, layers, K]`` with K distinct ids per row; the same on every rank for (mb, seed)."""
    from rr_fakes import distinct_ids

    return distinct_ids(T, layers, num_experts=E, top_k=K, seed=seed * 1000 + mb)


# -- (1) PP=2, 1F1B: R3 replay across stages -------------------------------------------------------


def pp_r3_rank() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    import rr_megatron_compat as rmc
    from rr_core import ReplayController, ReplayMode, select_stage, stage_moe_layer_numbers

    rmc.install()
    try:
        chunks = build_chunks(num_layers=4, moe_layer_freq=PP_FREQ)
        cfg = rmc.layout_config(chunks[0].config)
        pp_rank = ps.get_pipeline_model_parallel_rank()
        controller = ReplayController(num_experts=E, top_k=K)
        layers = rmc.attach(controller, chunks).layer_numbers
        try:
            batches = microbatches(4)
            # rollout side: record every stage's routers, gather all MoE layers on every rank
            controller.set_mode(ReplayMode.RECORD)
            run_step(chunks, batches, controller)
            gathered = []
            for mb in range(len(batches)):
                records = dict(zip(layers, controller.recorded(mb).unbind(1), strict=True))
                mine = rmc.stack_rank_routes(records, cfg, pp_rank)
                gathered.append(rmc.pp_gather(mine, cfg))  # [T, M, K] on both ranks
            controller.end_step()
            # the engine's routes in [B, S, M, K], shifted by 1-3 (mod E): still distinct, and
            # never the same set as the recorded row
            rollout = [
                (rmc.router_rows_to_batch(g.long(), BATCH) + 1 + mb % 3) % E
                for mb, g in enumerate(gathered)
            ]
            targets = [rmc.batch_to_router_rows(r) for r in rollout]
            stage_layers = stage_moe_layer_numbers(cfg, pp_rank)
            armed = [select_stage(t, cfg, "moe_layers", pp_rank) for t in targets]
            replay_armed(controller, chunks, armed, stage_layers)
            with capture_ids(chunks) as seen:
                losses = run_step(chunks, batches, controller)
            report = controller.end_step()
            return {
                "pp_rank": pp_rank,
                "layers": layers,
                "stage_layers": stage_layers,
                "moe_layers": rmc.rank_moe_layer_numbers(cfg, pp_rank),
                "gathered": [g.tolist() for g in gathered],
                "armed": [[sorted_rows(a[:, s]) for s in range(a.shape[1])] for a in armed],
                "seen": seen,
                "agreement": report.agreement,
                "replayed": list(report.replayed_microbatches),
                "grads": router_grads(chunks),
                "losses": losses,
            }
        finally:
            controller.detach()
    finally:
        rmc.uninstall()


def test_A3_pp2_1f1b_r3_replay_across_stages_yields_the_armed_ids() -> None:
    from rr_fakes.shims.megatron import ParallelSizes

    results = launch(pp_r3_rank, 2, sizes=ParallelSizes(pp=2), timeout_s=TIMEOUT_S)
    first, last = results
    assert (first["pp_rank"], last["pp_rank"]) == (0, 1)
    assert first["layers"] == first["stage_layers"] == (1,)
    assert last["layers"] == last["stage_layers"] == (3, 4)
    # both ranks gathered the same routes for all three MoE layers
    assert first["gathered"] == last["gathered"]
    assert torch.tensor(first["gathered"]).shape == (4, T, 3, K)
    for result in results:
        assert result["seen"]["recompute"] == {}
        assert result["replayed"] == [0, 1, 2, 3]
        for slot, layer in enumerate(result["layers"]):
            forwards = result["seen"]["forward"][layer]
            assert len(forwards) == 4
            for mb in range(4):
                assert forwards[mb] == result["armed"][mb][slot], (layer, mb)
            # the armed ids are not what the router picks natively (layer 1 sees the recorded
            # input, so none of its rows agree)
            assert result["agreement"][layer] < 1.0
            assert result["grads"][layer] > 0.0  # backward ran through the replayed router
    assert first["agreement"][1] == 0.0
    assert first["losses"] == []
    assert len(last["losses"]) == 4


# -- (2) EP=2, alltoall dispatcher: duplicate ids (C1) ---------------------------------------------


def ep_duplicates_rank() -> dict[str, Any]:
    import torch.distributed as dist

    import rr_megatron_compat as rmc
    from rr_core import ReplayController, ReplayError, ReplayMode

    rank = dist.get_rank()
    rmc.install()
    try:
        models = {"alltoall": build_chunks(dispatcher="alltoall")}
        models["allgather"] = build_chunks(dispatcher="allgather")
        copy_weights(models["alltoall"], models["allgather"])
        batches = microbatches(2, seed=10 * rank)  # DP=2: each rank has its own data
        targets = []
        for mb in range(2):
            routes = distinct_targets(mb, 4, seed=rank + 1)
            routes[mb::3, :, 1] = routes[mb::3, :, 0]  # repeated ids, more on some layers
            routes[1::5, 2, 1] = routes[1::5, 2, 0]
            targets.append(routes)
        out: dict[str, Any] = {"rank": rank, "losses": {}, "seen": {}, "grads": {}}
        for name, chunks in models.items():
            controller = ReplayController(num_experts=E, top_k=K)
            layers = rmc.attach(controller, chunks).layer_numbers
            try:
                controller.set_mode(ReplayMode.REPLAY)
                try:
                    controller.arm(0, targets[0], layer_numbers=layers)
                except ReplayError as error:
                    out["refused"] = str(error)
                else:
                    out["refused"] = None
                for mb, routes in enumerate(targets):
                    controller.arm(mb, routes, layer_numbers=layers, validate=False)
                with capture_ids(chunks) as seen:
                    out["losses"][name] = run_step(chunks, batches, controller)
                controller.end_step()
                out["seen"][name] = seen["forward"]
                out["grads"][name] = {
                    n: p.grad.clone() for c in chunks for n, p in c.named_parameters()
                }
            finally:
                controller.detach()
        out["armed"] = [[sorted_rows(t[:, s]) for s in range(4)] for t in targets]
        a, b = out["grads"]["alltoall"], out["grads"]["allgather"]
        out["grad_diff"] = max(float((a[n] - b[n]).abs().max()) for n in a)
        del out["grads"]
        return out
    finally:
        rmc.uninstall()


def test_C1_ep2_alltoall_replays_duplicate_ids_like_allgather_and_validate_refuses() -> None:
    from rr_fakes.shims.megatron import ParallelSizes

    results = launch(ep_duplicates_rank, 2, sizes=ParallelSizes(ep=2), timeout_s=TIMEOUT_S)
    for result in results:
        # the default check refuses the repeated ids, naming micro-batch, layer and row
        refused = result["refused"]
        assert refused is not None
        assert "repeated expert id" in refused
        assert "micro-batch 0, layer" in refused
        # with validate=False both dispatchers run and route exactly the armed sets
        for name in ("alltoall", "allgather"):
            seen = result["seen"][name]
            assert sorted(seen) == [1, 2, 3, 4]
            for slot, layer in enumerate(sorted(seen)):
                for mb in range(2):
                    assert seen[layer][mb] == result["armed"][mb][slot], (name, layer, mb)
        assert any(len(row) == 1 for row in result["armed"][0][0])  # duplicates did reach it
        alltoall, allgather = result["losses"]["alltoall"], result["losses"]["allgather"]
        assert len(alltoall) == 2
        assert alltoall == pytest.approx(allgather, rel=1e-5, abs=1e-6)
        assert result["grad_diff"] < 1e-5


# -- (3) PP=2 x VPP=2, interleaved schedule with activation recompute (B1) -------------------------


def vpp_recompute_rank() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    import rr_megatron_compat as rmc
    from rr_core import ReplayController, moe_layer_numbers, select_stage

    rmc.install()
    try:
        recompute = build_chunks(recompute=True, num_layers=8, moe_layer_freq=VPP_FREQ)
        plain = build_chunks(num_layers=8, moe_layer_freq=VPP_FREQ)
        copy_weights(recompute, plain)
        cfg = rmc.layout_config(recompute[0].config)
        pp_rank = ps.get_pipeline_model_parallel_rank()
        assert cfg.vp_size == len(recompute) == 2
        batches = microbatches(4, seed=3)
        M = len(moe_layer_numbers(cfg))
        targets = [distinct_targets(mb, M, seed=7) for mb in range(4)]  # different per mb
        rank_layers = rmc.rank_moe_layer_numbers(cfg, pp_rank)
        # this rank's slots only, chunk by chunk
        armed = [
            torch.cat([select_stage(t, cfg, "moe_layers", pp_rank, vp) for vp in (0, 1)], dim=-2)
            for t in targets
        ]
        out: dict[str, Any] = {"pp_rank": pp_rank, "rank_layers": rank_layers}
        grads = {}
        for name, chunks in (("recompute", recompute), ("plain", plain)):
            controller = ReplayController(num_experts=E, top_k=K)
            layers = rmc.attach(controller, chunks).layer_numbers
            try:
                assert layers == tuple(sorted(rank_layers))
                replay_armed(controller, chunks, armed, rank_layers)
                with capture_ids(chunks) as seen:
                    out[f"losses_{name}"] = run_step(chunks, batches, controller)
                controller.end_step()
                out[f"seen_{name}"] = seen
                grads[name] = {
                    f"{i}.{n}": p.grad.clone()
                    for i, c in enumerate(chunks)
                    for n, p in c.named_parameters()
                }
            finally:
                controller.detach()
        out["armed"] = {
            layer: [sorted_rows(a[:, slot]) for a in armed]
            for slot, layer in enumerate(rank_layers)
        }
        a, b = grads["recompute"], grads["plain"]
        assert sorted(a) == sorted(b)
        out["grad_diff"] = max(float((a[n] - b[n]).abs().max()) for n in a)
        out["grad_size"] = min(float(a[n].abs().sum()) for n in a if "router" in n)
        return out
    finally:
        rmc.uninstall()


def test_B1_A3_vpp2_interleaved_recompute_replays_each_microbatch_own_targets() -> None:
    from rr_fakes.shims.megatron import ParallelSizes

    results = launch(vpp_recompute_rank, 2, sizes=ParallelSizes(pp=2, vpp=2), timeout_s=TIMEOUT_S)
    assert [r["rank_layers"] for r in results] == [(2, 5), (3, 7, 8)]
    for result in results:
        armed = result["armed"]
        recomputed = result["seen_recompute"]
        assert sorted(recomputed["forward"]) == sorted(recomputed["recompute"]) == sorted(armed)
        for layer, per_mb in armed.items():
            assert len({str(rows) for rows in per_mb}) == 4  # targets differ per micro-batch
            # forward and recompute of each micro-batch route exactly its own armed ids
            assert recomputed["forward"][layer] == per_mb, layer
            assert recomputed["recompute"][layer] == per_mb, layer
            assert result["seen_plain"]["forward"][layer] == per_mb, layer
        assert result["seen_plain"]["recompute"] == {}
        # recompute with replay changes nothing: same losses and gradients as without it
        assert result["losses_recompute"] == result["losses_plain"]
        assert result["grad_diff"] <= 1e-6
        assert result["grad_size"] > 0.0
