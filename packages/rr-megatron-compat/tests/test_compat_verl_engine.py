"""rr drives verl 0.9.1's own Megatron engine: ``rr_megatron_compat.verl.install()``, then
verl's unchanged ``MegatronEngineWithLMHead.forward_backward_batch`` on tiny real GPTModels
(rr_fakes' verl harness). Exactness is read router by router from forward hooks, in the forward
and in the backward recompute, and every run is compared with the same run under verl's own
router replay: same routes, same log-probs, same gradients. Where verl is silently wrong, rr
raises.

Skipped where verl or megatron-core cannot be imported (the ``verl`` nox session has both)."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import rr_megatron_compat.verl as rv
from rr_core import ReplayError
from rr_fakes.shims.megatron import model_parallel
from rr_fakes.shims.megatron import unavailable_reason as megatron_reason

REASON = megatron_reason()
if REASON is None:
    from rr_fakes.shims.verl import unavailable_reason as verl_reason

    REASON = verl_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

if REASON is None:
    import rr_fakes.shims.verl as vh


@contextmanager
def engine_for(
    mode: str, *, rr: bool, recompute: bool, freq: Any, extra_build: bool = False
) -> Iterator[Any]:
    """verl's engine over a tiny model built from a fixed seed, under rr's names (``rr``) or
    verl's own; ``extra_build`` builds the model twice first and keeps the first alive (the
    orphan routers a rebuilt decoder leaves behind, A1)."""
    with vh.verl_cpu(), model_parallel():
        if rr:
            rv.install()
        try:
            cfg = vh.tiny_config(recompute=recompute, freq=freq)
            orphan = vh.build_verl_chunks(cfg, mode=mode) if extra_build else None
            torch.manual_seed(0)
            chunks = vh.build_verl_chunks(cfg, mode=mode)
            yield vh.verl_engine(chunks, mode=mode), cfg, orphan
        finally:
            if rr:
                rv.uninstall()


def run_r2(
    kind: str, recompute: bool, freq: Any, *, rr: bool, extra_build: bool = False
) -> dict[str, Any]:
    with engine_for("R2", rr=rr, recompute=recompute, freq=freq, extra_build=extra_build) as (
        engine,
        cfg,
        _orphan,
    ):
        chunks = engine.module
        layers = [r.layer_number for r in vh.routers(chunks)]

        def batch(**kw: Any) -> Any:
            return vh.verl_batch(
                vh.PROMPTS, vh.RESPONSES, cfg.vocab_size, **vh.BATCHINGS[kind], **kw
            )

        with vh.route_log(chunks) as native:
            record = vh.run_step(engine, batch(enable_routing_replay=True), forward_only=True)
        routes = record["model_output"]["routed_experts"]
        vh.perturb(chunks)
        with vh.route_log(chunks) as replay:
            out = vh.run_step(
                engine, batch(routed_experts=routes, enable_routing_replay=True), forward_only=False
            )
        result: dict[str, Any] = {
            "routes": routes,
            "log_probs": out["model_output"]["log_probs"].values().detach(),
            "grads": torch.cat([r.weight.grad.flatten() for r in vh.routers(chunks)]),
            "layers": layers,
            "instances": len(rv.RouterReplay.router_instances) if rr else None,
        }
        passes = [(False, native), (False, replay)] + ([(True, replay)] if recompute else [])
        for layer in layers:
            for rec, log in passes:
                assert vh.routed_as(
                    log, routes, engine.tf_config, layer, recompute=rec, reordered=kind == "dynamic"
                ), f"layer {layer}, recompute={rec}"
        return result


@pytest.mark.parametrize(
    ("kind", "recompute", "freq"),
    [
        ("one", False, 1),
        ("one", True, [0, 1, 1, 1]),
        ("per_sequence", True, [0, 1, 1, 1]),  # > 1 micro-batch, full recompute, logits.div_
        ("per_sequence", False, 1),
        ("dynamic", True, 1),
    ],
)
def test_R2_through_verls_engine_is_exact_and_equals_verls_own_replay(
    kind: str, recompute: bool, freq: Any
) -> None:
    ours = run_r2(kind, recompute, freq, rr=True)
    theirs = run_r2(kind, recompute, freq, rr=False)
    assert ours["routes"].dtype == theirs["routes"].dtype == torch.int16
    assert torch.equal(ours["routes"].offsets(), theirs["routes"].offsets())
    assert torch.equal(ours["routes"].values(), theirs["routes"].values())
    torch.testing.assert_close(ours["log_probs"], theirs["log_probs"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours["grads"], theirs["grads"], rtol=1e-4, atol=1e-6)


def test_R2_with_a_model_built_twice_replays_the_forwarded_routers() -> None:
    """A rebuilt decoder leaves live orphan routers: verl's engine passes the forwarded model,
    and rr addresses only its routers; router_instances counts every live one (verl's count)."""
    result = run_r2("per_sequence", True, [0, 1, 1, 1], rr=True, extra_build=True)
    assert result["instances"] == 2 * len(result["layers"])


def run_r3(kind: str, recompute: bool, freq: Any, all_layers: bool, *, rr: bool) -> dict[str, Any]:
    with engine_for("R3", rr=rr, recompute=recompute, freq=freq) as (engine, cfg, _):
        chunks = engine.module
        layers = [r.layer_number for r in vh.routers(chunks)]
        columns = cfg.num_layers if all_layers else len(layers)
        routes = vh.rollout_routes(vh.LENGTHS, columns, cfg)
        data = vh.verl_batch(
            vh.PROMPTS,
            vh.RESPONSES,
            cfg.vocab_size,
            **vh.BATCHINGS[kind],
            routed_experts=routes,
            enable_routing_replay=True,
        )
        vh.perturb(chunks)
        with vh.route_log(chunks) as log:
            out = vh.run_step(engine, data, forward_only=False)
        ends = torch.tensor(vh.LENGTHS).cumsum(0)
        keep = torch.ones(int(ends[-1]), dtype=torch.bool)
        keep[ends - 1] = False  # the rollout never routed the last sampled token
        for layer in layers:
            column = vh.moe_column(engine.tf_config, layer, columns)
            target = torch.cat([r[:, column, :].long() for r in routes]).sort(-1).values
            for rec in [False, True] if recompute else [False]:
                used = log.rows(layer, recompute=rec).sort(-1).values
                assert torch.equal(used[keep], target), f"layer {layer}, recompute={rec}"
        return {
            "log_probs": out["model_output"]["log_probs"].values().detach(),
            "grads": torch.cat([r.weight.grad.flatten() for r in vh.routers(chunks)]),
        }


@pytest.mark.parametrize(
    ("kind", "recompute", "freq", "all_layers"),
    [
        ("one", False, 1, True),
        ("per_sequence", True, [0, 1, 1, 1], True),
        ("per_sequence", True, [0, 1, 1, 1], False),
        ("one", True, [0, 1, 1, 1], False),
    ],
)
def test_R3_through_verls_engine_is_exact_and_equals_verls_own_replay(
    kind: str, recompute: bool, freq: Any, all_layers: bool
) -> None:
    ours = run_r3(kind, recompute, freq, all_layers, rr=True)
    theirs = run_r3(kind, recompute, freq, all_layers, rr=False)
    torch.testing.assert_close(ours["log_probs"], theirs["log_probs"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours["grads"], theirs["grads"], rtol=1e-4, atol=1e-6)


def duplicated_routes(cfg: Any) -> list[torch.Tensor]:
    routes = vh.rollout_routes(vh.LENGTHS, cfg.num_layers, cfg)
    routes[1][2, 1, 1] = routes[1][2, 1, 0]  # one row of layer 2 names an expert twice
    return routes


def duplicate_batch(cfg: Any) -> Any:
    return vh.verl_batch(
        vh.PROMPTS,
        vh.RESPONSES,
        cfg.vocab_size,
        micro_batch_size=1,
        routed_experts=duplicated_routes(cfg),
        enable_routing_replay=True,
    )


def test_R3_duplicate_ids_verl_dispatches_a_token_to_fewer_experts_silently() -> None:
    with engine_for("R3", rr=False, recompute=True, freq=1) as (engine, cfg, _):
        layer2 = next(r for r in vh.routers(engine.module) if r.layer_number == 2)
        experts_per_token: list[int] = []

        def count(module: Any, args: Any, out: Any) -> None:
            experts_per_token.append(int(out[1].sum(-1).min()))

        handle = layer2.register_forward_hook(count)
        try:
            vh.run_step(engine, duplicate_batch(cfg), forward_only=False)  # no error, no warning
        finally:
            handle.remove()
        assert min(experts_per_token) == cfg.top_k - 1


def test_R3_duplicate_ids_rr_raises_naming_the_layer_and_row() -> None:
    with engine_for("R3", rr=True, recompute=True, freq=1) as (engine, cfg, _):
        with pytest.raises(ReplayError, match=r"layer 2, row 2: .* a repeated expert id"):
            vh.run_step(engine, duplicate_batch(cfg), forward_only=False)
        rv.RouterReplay.clear_global_indices()
        rv.RouterReplay.clear_global_router_replay_action()


def test_install_makes_verls_engine_module_use_rr() -> None:
    impl = importlib.import_module("verl.workers.engine.megatron.transformer_impl")
    with vh.verl_cpu():
        rv.install()
        try:
            assert impl.set_router_replay_data is rv.set_router_replay_data
            assert impl.RouterReplay is rv.RouterReplay
        finally:
            rv.uninstall()
    assert impl.set_router_replay_data is not rv.set_router_replay_data
    gc.collect()
