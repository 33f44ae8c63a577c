"""verl's real FSDP engine (FSDPEngineWithLMHead, FSDP2 on a one-rank gloo group, verl's own
forward_backward_batch / forward_step / packing) replaying tiny transformers MoE models with
rr's FSDP side installed (``rr_transformers.verl.ADAPTER.install()``, which the one line
``rr_megatron_compat.verl.install()`` runs): every router's ids, read off the experts modules,
equal the armed ones on every replayed row, in the forward and in the checkpoint
recompute of the update, packed and padded."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

import pytest
import torch

pytest.importorskip("verl")

from verl.utils.torch_functional import allgather_dict_into_dict

import rr_transformers
import rr_transformers.verl as rr_verl
from rr_core import ReplayController, RRError
from rr_fakes import distinct_ids
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, VOCAB
from rr_fakes.shims.verl._batch import run_step, verl_batch
from rr_fakes.shims.verl._fsdp import (
    expert_ids,
    fsdp_cpu,
    fsdp_engine,
    perturb_sharded_routers,
)

FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v3")
LAYOUTS = ("packed", "padded")
PROMPTS, RESPONSES = (3, 5, 4, 6), (2, 3, 4, 2)
LENGTHS = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]
MICRO = 2  # sequences per micro-batch: two micro-batches, in batch order


@pytest.fixture
def verl_cpu() -> Iterator[None]:
    with fsdp_cpu():
        rr_verl.ADAPTER.install()
        yield
        rr_verl.uninstall()
        rr_transformers.uninstall()  # the router hooks install() put in


@pytest.fixture
def engines(verl_cpu: None) -> Iterator[list[Any]]:
    """Engines a test builds; their controllers are released after it."""
    built: list[Any] = []
    yield built
    for engine in built:
        controller = rr_verl.controller_of(engine.module)
        if controller is not None:
            rr_verl.detach(controller)


def _batch(layout: str, *, routes: Any = None, replay: bool = True, **options: Any) -> Any:
    options.setdefault("micro_batch_size", MICRO)
    return verl_batch(
        PROMPTS,
        RESPONSES,
        VOCAB,
        routed_experts=routes,
        enable_routing_replay=replay,
        extra={"use_remove_padding": layout == "packed"},
        **options,
    )


def _per_sequence(calls: list[torch.Tensor], layout: str) -> list[torch.Tensor]:
    """One forward's experts calls (one per micro-batch, in order) as ``[T_b, K]`` per
    sequence: the packed rows in order, a right-padded micro-batch's real rows."""
    out: list[torch.Tensor] = []
    for m, ids in enumerate(calls):
        lengths = LENGTHS[m * MICRO : (m + 1) * MICRO]
        if layout == "packed":
            out += list(ids.split(lengths))
        else:
            padded = ids.view(len(lengths), -1, ids.shape[-1])
            out += [padded[b, :n] for b, n in enumerate(lengths)]
    return out


def _passes(calls: list[torch.Tensor], recompute: bool) -> list[list[torch.Tensor]]:
    """The forward calls, and with checkpointing the recompute calls: micro-batch m's forward
    then its backward's recompute."""
    if not recompute:
        return [calls]
    assert len(calls) == 2 * len(LENGTHS) // MICRO
    return [calls[0::2], calls[1::2]]


def _sets(ids: torch.Tensor) -> torch.Tensor:
    return ids.to(torch.int64).sort(dim=-1).values


def _rollout_routes(engine: Any, *, all_layers: bool) -> list[torch.Tensor]:
    """Rollout routes as an engine returns them: T - 1 rows (odd sequences) or T rows, on the
    all-layers axis (vLLM, SGLang: zeros on dense layers) or one slot per MoE layer."""
    routed = _routed_layers(engine)
    slots = len(routed) if all_layers else sum(routed)
    routes = []
    for b, n in enumerate(LENGTHS):
        ids = distinct_ids(n - b % 2, slots, num_experts=NUM_EXPERTS, top_k=TOP_K, seed=10 + b)
        if all_layers:
            ids[:, [not r for r in routed]] = 0
        routes.append(ids)
    return routes


def _routed_layers(engine: Any) -> list[bool]:
    return [
        any(type(m).__name__.lower().endswith("router") for m in layer.modules())
        for layer in engine.module.get_decoder().layers
    ]


def _native(engine: Any, layout: str) -> dict[int, list[torch.Tensor]]:
    with expert_ids(engine.module) as seen:
        run_step(engine, _batch(layout, replay=False), forward_only=True)
    return {layer: _per_sequence(calls, layout) for layer, calls in seen.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_r3_replays_rollout_routes(engines: list[Any], family: str, layout: str) -> None:
    engine = fsdp_engine(family, mode="R3")
    engines.append(engine)
    native = _native(engine, layout)  # enable_routing_replay=False: verl's reference forward
    routes = _rollout_routes(engine, all_layers=True)
    data = _batch(layout, routes=routes)
    moe_layers = sorted(native)
    with expert_ids(engine.module) as seen_log_prob:
        run_step(engine, data, forward_only=True)  # compute_log_prob
    with engine.train_mode(), expert_ids(engine.module) as seen_update:
        run_step(engine, data, forward_only=False)  # update_actor, checkpointed
        engine.optimizer_step()
    changed = 0
    for seen, recompute in ((seen_log_prob, False), (seen_update, True)):
        assert sorted(seen) == moe_layers
        for layer in moe_layers:
            for calls in _passes(seen[layer], recompute):
                for b, observed in enumerate(_per_sequence(calls, layout)):
                    armed = routes[b][:, layer - 1]  # all-layers axis: slot = layer - 1
                    last = LENGTHS[b] - 1  # its logits are never read: routes natively
                    assert torch.equal(_sets(observed[:last]), _sets(armed[:last])), (layer, b)
                    if not recompute and layer == moe_layers[0]:
                        # the first MoE layer's input does not depend on replay: native there
                        assert torch.equal(observed[last], native[layer][b][last])
                    changed += int((_sets(armed[:last]) != _sets(native[layer][b][:last])).any())
    assert changed > 0  # the rollout's routes are not the trainer's own choice
    report = rr_verl.last_report(engine.module)
    assert report is not None
    assert report.replayed_microbatches == (0, 1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_r2_records_then_replays_after_the_routers_move(
    engines: list[Any], family: str, layout: str
) -> None:
    engine = fsdp_engine(family, mode="R2")
    engines.append(engine)
    with expert_ids(engine.module) as seen:
        output = run_step(engine, _batch(layout), forward_only=True)  # compute_log_prob
    recorded = output["model_output"]["routed_experts"]
    assert recorded.is_nested
    assert recorded.dtype == torch.uint8
    parts = list(recorded.unbind())
    moe_layers = sorted(seen)
    assert [p.shape for p in parts] == [(n, len(moe_layers), TOP_K) for n in LENGTHS]
    for slot, layer in enumerate(moe_layers):
        for b, observed in enumerate(_per_sequence(seen[layer], layout)):
            assert torch.equal(parts[b][:, slot].to(torch.int64), observed)  # every row, as chosen

    perturb_sharded_routers(engine.module)  # the update's routers no longer choose these
    moved = _native(engine, layout)
    assert any(
        not torch.equal(_sets(moved[layer][b]), _sets(parts[b][:, slot]))
        for slot, layer in enumerate(moe_layers)
        for b in range(len(LENGTHS))
    )
    data = _batch(layout, routes=recorded)
    with engine.train_mode(), expert_ids(engine.module) as seen:
        run_step(engine, data, forward_only=False)  # update_actor replays the record
        routers = [
            m for m in engine.module.modules() if type(m).__name__.lower().endswith("router")
        ]
        assert all(
            r.weight.grad is not None and float(r.weight.grad.abs().sum()) > 0 for r in routers
        )
        engine.optimizer_step()
    for slot, layer in enumerate(moe_layers):
        for calls in _passes(seen[layer], recompute=True):
            for b, observed in enumerate(_per_sequence(calls, layout)):
                assert torch.equal(_sets(observed), _sets(parts[b][:, slot])), (layer, b)


def test_r2_record_in_batch_order_under_dynamic_batch_size(engines: list[Any]) -> None:
    engine = fsdp_engine("qwen3_moe", mode="R2")
    engines.append(engine)
    fixed = run_step(engine, _batch("packed"), forward_only=True)
    dynamic = run_step(
        engine, _batch("packed", micro_batch_size=None, max_token_len=10), forward_only=True
    )
    fixed_parts = fixed["model_output"]["routed_experts"].unbind()
    dynamic_parts = dynamic["model_output"]["routed_experts"].unbind()
    report = rr_verl.last_report(engine.module)
    assert report is not None
    assert len(report.recorded_microbatches) >= 3  # verl's token-balanced split, reordered
    for a, b in zip(fixed_parts, dynamic_parts, strict=True):
        assert torch.equal(a, b)


def test_r3_without_routes_is_refused_and_leaves_nothing_armed(engines: list[Any]) -> None:
    engine = fsdp_engine("qwen3_moe", mode="R3")
    engines.append(engine)
    with pytest.raises(rr_verl.VerlFSDPReplayError, match="no routed_experts"):
        run_step(engine, _batch("packed"), forward_only=True)
    routes = _rollout_routes(engine, all_layers=True)
    run_step(engine, _batch("packed", routes=routes), forward_only=True)  # a clean next pass
    assert rr_verl.last_report(engine.module).replayed_microbatches == (0, 1)


def test_routes_on_an_unknown_layer_axis_are_refused(engines: list[Any]) -> None:
    engine = fsdp_engine("qwen3_moe", mode="R3")
    engines.append(engine)
    routes = [distinct_ids(n, 5, num_experts=NUM_EXPERTS, top_k=TOP_K) for n in LENGTHS]
    with pytest.raises(rr_verl.VerlFSDPReplayError, match="5 layer slots; the model has 2 MoE"):
        run_step(engine, _batch("packed", routes=routes), forward_only=True)


def test_bucket_padding_is_refused(engines: list[Any]) -> None:
    engine = fsdp_engine("qwen3_moe", mode="R3", pad_to_length=True, pad_to_length_bucket=64)
    engines.append(engine)
    routes = _rollout_routes(engine, all_layers=False)
    with pytest.raises(rr_verl.VerlFSDPReplayError, match="pad_to_length"):
        run_step(engine, _batch("packed", routes=routes), forward_only=True)


def test_disabled_mode_and_uninstall_route_natively(engines: list[Any]) -> None:
    engine = fsdp_engine("qwen3_moe", mode="R3")
    engines.append(engine)
    native = _native(engine, "packed")
    routes = _rollout_routes(engine, all_layers=False)
    assert rr_verl.is_installed()
    router_hooks = len(rr_transformers.ADAPTER.patches)  # put in by rr_verl.install()
    assert rr_verl.uninstall() == 2 + router_hooks  # the engine's two hooks and the routers'
    assert not rr_verl.is_installed()
    assert not rr_transformers.is_installed()
    with expert_ids(engine.module) as seen:
        run_step(engine, _batch("packed", routes=routes), forward_only=True)
    for layer, calls in seen.items():
        for b, observed in enumerate(_per_sequence(calls, "packed")):
            assert torch.equal(observed, native[layer][b])
    assert rr_verl.ADAPTER.install() == (
        "FSDPEngine.forward_backward_batch",
        "FSDPEngineWithLMHead.forward_step",
    )


def test_a_controller_of_ones_own_drives_the_engine(engines: list[Any]) -> None:
    engine = fsdp_engine("mixtral", mode="R3")
    engines.append(engine)
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K, measure_agreement="exact")
    attachment = rr_verl.attach(controller, engine.module)
    assert attachment.layer_numbers == (1, 2, 3)
    assert rr_verl.controller_of(engine.module) is controller
    routes = _rollout_routes(engine, all_layers=False)
    run_step(engine, _batch("packed", routes=routes), forward_only=True)
    report = rr_verl.last_report(engine.module)
    assert report is not None
    assert report.replayed_microbatches == (0, 1)
    assert set(report.agreement) == {1, 2, 3}


def test_errors_are_rr_errors() -> None:
    assert issubclass(rr_verl.VerlFSDPReplayError, RRError)


def test_rr_figures_join_the_metrics_verl_returns(engines: list[Any]) -> None:
    """The pass's rr/ figures in the ``metrics`` of verl's own output (which verl's worker
    gathers and its trainer logs): every replayed row counted, and the (token, layer) pairs
    whose native choice differs from the replayed one, checked on the first MoE layer (whose
    input replay does not change) against the native routes."""
    engine = fsdp_engine("qwen3_moe", mode="R3")
    engines.append(engine)
    native = _native(engine, "packed")
    routes = _rollout_routes(engine, all_layers=True)
    returned = run_step(engine, _batch("packed", routes=routes), forward_only=True)["metrics"]
    # As verl's worker takes them: gathered over the data-parallel group (verl's own function),
    # then each key's per-rank lists chained into one (engine_workers.py, train_mini_batch).
    gathered = allgather_dict_into_dict(returned, group=engine.get_data_parallel_group())
    metrics = {key: list(chain.from_iterable(val)) for key, val in gathered.items()}
    assert all(len(val) == 1 for key, val in metrics.items() if key.startswith("rr/"))
    metrics = {key: val[0] for key, val in metrics.items()}
    rows = sum(LENGTHS) - len(LENGTHS)  # every row but each sequence's last (never read)
    assert metrics["rr/replayed_rows"] == rows
    first = min(native)
    differ_first = sum(
        int(
            not torch.equal(
                _sets(routes[b][t : t + 1, first - 1]), _sets(native[first][b][t : t + 1])
            )
        )
        for b, n in enumerate(LENGTHS)
        for t in range(n - 1)
    )
    report = rr_verl.last_report(engine.module)
    assert report is not None
    assert round((1.0 - report.agreement[first]) * rows) == differ_first > 0
    assert differ_first <= metrics["rr/routed_differently"] <= rows * len(native)
    assert 0.0 <= metrics["rr/order_agreement"] <= metrics["rr/agreement"] < 1.0
    assert metrics["rr/seconds"] > 0.0
