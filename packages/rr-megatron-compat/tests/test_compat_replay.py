"""Record and replay inside real megatron-core: exact routing maps in every layer, on every line,
for every router variant, with Megatron's activation recompute in backward."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from packaging.version import Version

import rr_megatron_compat as rmc
from compat_megatron_steps import (
    E,
    K,
    build,
    capture_maps,
    inputs,
    map_of,
    perturb,
    random_targets,
    routers,
    step,
)
from rr_core import ReplayController, ReplayError, ReplayMode, controller_of


def _line() -> Version:
    try:
        return rmc.megatron_line().version
    except ImportError:
        return Version("0")


LINE = _line()


@contextmanager
def attached(model: Any, **kw: Any) -> Iterator[ReplayController]:
    """A controller of E experts, top-K, attached to ``model`` for the block, detached after."""
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model, **kw)
    try:
        yield controller
    finally:
        controller.detach()


def record(model: Any, controller: ReplayController, batches: list[Any]) -> list[torch.Tensor]:
    controller.set_mode(ReplayMode.RECORD)
    step(model, batches, controller)
    routes = [controller.recorded(i) for i in range(len(batches))]
    controller.end_step()
    return routes


def assert_maps(
    maps: dict[int, list[torch.Tensor]], routes_TLK: list[torch.Tensor], layers: tuple[int, ...]
) -> None:
    assert sorted(maps) == sorted(layers)
    for slot, layer in enumerate(layers):
        assert len(maps[layer]) == len(routes_TLK)
        for mb, routes in enumerate(routes_TLK):
            assert torch.equal(maps[layer][mb], map_of(routes[:, slot])), (layer, mb)


VARIANTS: dict[str, dict[str, Any]] = {
    "softmax": {},
    "softmax-pre-scaled": {
        "extra": {"moe_router_pre_softmax": True, "moe_router_topk_scaling_factor": 2.5}
    },
    "sigmoid-expert-bias": {"score_function": "sigmoid", "expert_bias": True},
    "group-limited": {"extra": {"moe_router_num_groups": 4, "moe_router_group_topk": 2}},
    "aux-loss": {"aux_loss_coeff": 0.01},
    "seq-aux-loss": {
        "aux_loss_coeff": 0.01,
        "extra": {"moe_router_load_balancing_type": "seq_aux_loss"},
    },
    "z-loss": {"extra": {"moe_z_loss_coeff": 1e-3}},
    "allgather": {"dispatcher": "allgather", "aux_loss_coeff": 0.01},
}
if Version("0.14") <= LINE:  # global_aux_loss exists from 0.14
    VARIANTS["global-aux-loss"] = {
        "aux_loss_coeff": 0.01,
        "extra": {"moe_router_load_balancing_type": "global_aux_loss"},
    }


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_record_then_replay_reproduces_routing_maps_with_recompute(
    megatron: None, variant: str
) -> None:
    """Record (native routing, unchanged), perturb the routers, replay: every layer's routing
    map equals the recorded one, and backward (with Megatron's recompute) reaches the router."""
    kw = dict(VARIANTS[variant])
    model = build(recompute=True, **kw)
    batches = inputs(2)
    with capture_maps(model) as native_maps:
        native_losses = step(model, batches)
    with attached(model) as controller:
        with capture_maps(model) as recorded_maps:
            recorded_losses = step_record = None
            controller.set_mode(ReplayMode.RECORD)
            recorded_losses = step(model, batches, controller)
            step_record = [controller.recorded(i) for i in range(2)]
            controller.end_step()
        # recording changes nothing: same maps, same losses as the unattached run
        assert recorded_losses == native_losses
        for layer in native_maps:
            for a, b in zip(native_maps[layer], recorded_maps[layer], strict=True):
                assert torch.equal(a, b)
        assert_maps(recorded_maps, step_record, controller.layer_numbers)
        perturb(model)
        for _, router in routers(model):
            router.weight.grad = None
        controller.set_mode(ReplayMode.REPLAY)
        for mb, routes in enumerate(step_record):
            controller.arm(mb, routes, layer_numbers=controller.layer_numbers)
        with capture_maps(model) as replay_maps:
            step(model, batches, controller)
        report = controller.end_step()
        assert_maps(replay_maps, step_record, controller.layer_numbers)
        assert min(report.agreement.values()) < 1.0  # the perturbation changed native routing
        for _, router in routers(model):
            grad = router.weight.main_grad if hasattr(router.weight, "main_grad") else None
            grad = router.weight.grad if grad is None else grad
            assert grad is not None
            assert bool(grad.abs().sum() > 0)


@pytest.mark.parametrize("variant", ["softmax", "sigmoid-expert-bias", "group-limited"])
def test_replaying_perturbed_targets_yields_exactly_those_targets(
    megatron: None, variant: str
) -> None:
    model = build(recompute=True, **VARIANTS[variant])
    batches = inputs(2)
    with attached(model) as controller:
        layers = controller.layer_numbers
        targets = [random_targets(16, len(layers), seed=mb) for mb in range(2)]
        if variant == "group-limited":  # targets outside the chosen groups are allowed too
            targets = [t.flip(-1) for t in targets]
        controller.set_mode(ReplayMode.REPLAY)
        for mb, routes in enumerate(targets):
            controller.arm(mb, routes, layer_numbers=layers)
        with capture_maps(model) as maps:
            step(model, batches, controller)
        controller.end_step()
        assert_maps(maps, targets, layers)


def test_A1_model_built_twice_replays_on_the_live_model_and_orphans_stay_untouched(
    megatron: None,
) -> None:
    orphan = build()
    live = build()
    orphan_routers = [r for _, r in routers(orphan)]
    if rmc.megatron_line().native_replay:
        from megatron.core.transformer.moe.router_replay import RouterReplay

        instances = RouterReplay.global_router_replay_instances
        ours = [r.router_replay for r in orphan_routers]
        assert [i for i in instances if any(i is o for o in ours)]  # orphans are in the list
    with attached(live) as controller:
        assert all(controller_of(r) is None for r in orphan_routers)
        targets = [random_targets(16, 4)]
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, targets[0], layer_numbers=controller.layer_numbers)
        with capture_maps(live) as maps:
            step(live, inputs(1), controller)
        controller.end_step()
        assert_maps(maps, targets, controller.layer_numbers)
        for router in orphan_routers:
            replay = getattr(router, "router_replay", None)
            if replay is not None:
                assert replay.router_replay_action is None
                assert replay.target_topk_idx is None
                assert replay.recorded_topk_idx is None


def test_A2_dense_first_layers_replay_from_an_all_layers_axis(megatron: None) -> None:
    model = build(moe_layer_freq=[0, 1, 1, 1])
    with attached(model) as controller:
        assert controller.layer_numbers == (2, 3, 4)
        all_layers = random_targets(16, 4)
        all_layers[:, 0] = 0  # dense layer: no route (engines return zeros there)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, all_layers, layer_numbers=(1, 2, 3, 4))
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
        assert_maps(maps, [all_layers[:, 1:]], (2, 3, 4))


def test_A4_mtp_routers_are_never_armed(megatron: None) -> None:
    model = build(mtp_num_layers=1)
    mtp = [m for n, m in model.named_modules() if n.startswith("mtp") and n.endswith("router")]
    assert len(mtp) == 1
    with attached(model) as controller:
        assert controller.layer_numbers == (1, 2, 3, 4)
        assert controller_of(mtp[0]) is None
        targets = [random_targets(16, 4)]
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, targets[0], layer_numbers=(1, 2, 3, 4))
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
        assert_maps(maps, targets, (1, 2, 3, 4))
        replay = getattr(mtp[0], "router_replay", None)
        assert replay is None or replay.router_replay_action is None


def test_A6_a_model_without_moe_layers_attaches_and_takes_part(megatron: None) -> None:
    """A stage with zero MoE layers (here: a dense model) attaches, arms and ends the step."""
    model = build(moe_layer_freq=[0, 0, 0, 0])
    with attached(model) as controller:
        assert controller.layer_numbers == ()
        controller.set_mode(ReplayMode.REPLAY) if controller.layer_numbers else None
        controller.arm(0, random_targets(16, 4), layer_numbers=(1, 2, 3, 4))
        step(model, inputs(1), controller)
        controller.end_step()


def test_A6_walk_is_in_layer_order_whatever_the_chunk_order(megatron: None) -> None:
    model = build()
    assert [layer for layer, _ in routers([model])] == [1, 2, 3, 4]
    controller = ReplayController(num_experts=E, top_k=K)
    try:
        assert rmc.attach(controller, [model]).layer_numbers == (1, 2, 3, 4)
    finally:
        controller.detach()


def test_B1_targets_are_keyed_by_microbatch_through_backward_recompute(megatron: None) -> None:
    """Two micro-batches with different targets; recompute of each uses its own."""
    model = build(recompute=True)
    with attached(model) as controller:
        targets = [random_targets(16, 4, seed=mb + 10) for mb in range(3)]
        controller.set_mode(ReplayMode.REPLAY)
        for mb, routes in enumerate(targets):
            controller.arm(mb, routes, layer_numbers=controller.layer_numbers)
        recomputed: list[torch.Tensor] = []
        hooks = [
            r.register_forward_hook(
                lambda m, a, out: (
                    recomputed.append(out[1].detach().clone())
                    if torch._C._current_graph_task_id() != -1
                    else None
                )
            )
            for _, r in routers(model)
        ]
        try:
            step(model, inputs(3), controller)
        finally:
            for h in hooks:
                h.remove()
        controller.end_step()
        expected = [map_of(t[:, slot]) for t in targets for slot in range(4)]
        assert len(recomputed) == 12
        assert all(any(torch.equal(r, e) for e in expected) for r in recomputed)
        # backward recomputes layers last-first, micro-batch by micro-batch
        assert [
            torch.equal(r, map_of(targets[i // 4][:, 3 - i % 4])) for i, r in enumerate(recomputed)
        ] == [True] * 12


def test_B2_forward_only_pass_leaves_nothing_for_the_next_backward(megatron: None) -> None:
    model = build(recompute=True)
    with attached(model) as controller:
        old = random_targets(16, 4, seed=1)
        new = random_targets(16, 4, seed=2)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, old, layer_numbers=controller.layer_numbers)
        with torch.no_grad():
            step(model, inputs(1), controller, forward_only=True)
        controller.end_step()
        controller.arm(0, new, layer_numbers=controller.layer_numbers)
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
        assert_maps(maps, [new], controller.layer_numbers)


def test_B3_replay_without_targets_raises_naming_the_layer(megatron: None) -> None:
    model = build()
    with attached(model) as controller:
        controller.set_mode(ReplayMode.REPLAY)
        with pytest.raises(ReplayError, match="layer 1 fired in REPLAY"):
            step(model, inputs(1), controller)


def test_B4_gradient_reaches_replayed_experts_the_native_router_would_not_pick(
    megatron: None,
) -> None:
    model = build()
    with attached(model) as controller:
        controller.set_mode(ReplayMode.RECORD)
        step(model, inputs(1), controller, forward_only=True)
        native = controller.recorded(0)
        controller.end_step()
        for _, router in routers(model):
            router.weight.grad = None
        # replay experts that the native router never chose for any token
        unused = [
            sorted(set(range(E)) - set(native[:, slot].flatten().tolist())) for slot in range(4)
        ]
        targets = native.clone()
        for slot, free in enumerate(unused):
            if free:
                targets[:, slot, 0] = free[0]
                targets[:, slot, 1] = torch.where(
                    targets[:, slot, 1] == free[0], (free[0] + 1) % E, targets[:, slot, 1]
                )
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, targets, layer_numbers=controller.layer_numbers)
        step(model, inputs(1), controller)
        controller.end_step()
        for slot, (_, router) in enumerate(routers(model)):
            grad = getattr(router.weight, "main_grad", None)
            grad = router.weight.grad if grad is None else grad
            if unused[slot]:
                assert bool(grad[unused[slot][0]].abs().sum() > 0), slot


def test_B5_C5_detached_and_unattached_models_route_natively(megatron: None) -> None:
    policy, reference = build(), build()
    with capture_maps(reference) as before:
        step(reference, inputs(1))
    with attached(policy) as controller:
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, random_targets(16, 4), layer_numbers=controller.layer_numbers)
        step(policy, inputs(1), controller)
        with capture_maps(reference) as during:  # reference model: never armed (C5)
            step(reference, inputs(1))
        controller.end_step()
    with capture_maps(policy) as after:  # detached: native again, nothing left over (B5)
        step(policy, inputs(1))
    for layer in before:
        assert torch.equal(before[layer][0], during[layer][0])
    assert all(controller_of(r) is None for _, r in routers(policy))
    assert sorted(after) == [1, 2, 3, 4]
