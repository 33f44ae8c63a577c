"""The replay controller on tiny real-autograd models: replaying recorded or other ids reproduces
routing exactly, on either layer axis, from routes or a route batch, rows without a route
routed natively."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import ReplayController, ReplayError, ReplayMode

from rr_core_testing import E, K, TinyModel, random_routes, replaying_tiny_model, route_meta, tokens


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    t=st.integers(1, 12),
    recompute=st.sampled_from([None, "reentrant", "non_reentrant"]),
)
def test_replaying_recorded_ids_reproduces_native_routing(
    seed: int, t: int, recompute: str | None
) -> None:
    model = TinyModel(num_layers=3, recompute=recompute, seed=seed)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        x = tokens(t, seed)
        native_out = model(x)
        native_ids = model.routed_ids()
        layers = ctrl.attach(model)
        ctrl.set_mode(ReplayMode.RECORD)
        with torch.no_grad():
            model(x)
        recorded = ctrl.recorded()
        ctrl.end_step()
        assert torch.equal(recorded, native_ids)

        ctrl.set_mode(ReplayMode.REPLAY)
        ctrl.arm(0, recorded.to(torch.uint8), layer_numbers=layers)
        out = model(x)
        out.sum().backward()
        report = ctrl.end_step()
        assert torch.equal(model.routed_ids(), native_ids)
        assert torch.allclose(out, native_out)
        assert report.agreement == dict.fromkeys(layers, 1.0)
    finally:
        ctrl.detach()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(1, 12))
def test_B4_replaying_other_ids_uses_exactly_them_and_gradients_reach_them(
    seed: int, t: int
) -> None:
    model = TinyModel(num_layers=2, seed=seed)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        layers = ctrl.attach(model)
        ctrl.set_mode(ReplayMode.REPLAY)
        targets = random_routes(t, len(layers), seed)
        ctrl.arm(0, targets, layer_numbers=layers)
        model(tokens(t, seed)).sum().backward()
        ctrl.end_step()
        assert torch.equal(model.routed_ids(), targets.long())
        for slot, layer in enumerate(model.moe_layers()):
            scores = layer.router.last_scores_TE
            grad_at_targets = scores.grad.gather(1, targets[:, slot].long())
            # Softmax gradient at a chosen expert is never exactly zero for these inputs.
            assert bool((grad_at_targets != 0).all()), (
                f"no gradient at replayed experts, layer {slot}"
            )
            assert layer.router.weight.grad is not None
    finally:
        ctrl.detach()


def test_agreement_is_below_one_when_replay_changes_routing(controller: ReplayController) -> None:
    model, layers = replaying_tiny_model(controller)
    controller.arm(0, random_routes(64, len(layers)), layer_numbers=layers)
    model(tokens(64))
    agreement = controller.agreement()
    controller.end_step()
    assert set(agreement) == set(layers)
    assert all(0.0 <= share < 0.5 for share in agreement.values()), agreement


def test_D1_last_row_without_route_goes_to_the_native_router(controller: ReplayController) -> None:
    model = TinyModel(num_layers=2)
    x = tokens(5)
    model(x)
    native = model.routed_ids()
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    routes = random_routes(5, len(layers))
    routes[-1] = 0
    mask = torch.tensor([True, True, True, True, False])
    controller.arm(0, routes, layer_numbers=layers, replay_mask_T=mask)
    model(x)
    controller.end_step()
    used = model.routed_ids()
    assert torch.equal(used[:4], routes[:4].long())
    assert torch.equal(used[4], native[4])


def test_A2_routes_on_either_layer_axis_reach_the_right_routers(
    controller: ReplayController,
) -> None:
    """Dense-first model: engines send all layers (dense slots zero), the trainer has routers
    on MoE layers only. Both axes arm the same routers; a mislabelled axis raises."""
    model = TinyModel(num_layers=4, moe=[False, True, False, True])
    layers = controller.attach(model)
    assert layers == (2, 4)
    controller.set_mode(ReplayMode.REPLAY)
    moe_routes = random_routes(3, 2)
    all_routes = torch.zeros(3, 4, K, dtype=torch.uint8)
    all_routes[:, [1, 3]] = moe_routes
    for mb, (routes, numbers) in enumerate([(moe_routes, (2, 4)), (all_routes, (1, 2, 3, 4))]):
        controller.arm(mb, routes, layer_numbers=numbers)
        with controller.microbatch(mb):
            model(tokens(3))
        assert torch.equal(model.routed_ids(), moe_routes.long())
    controller.end_step()
    with pytest.raises(ReplayError, match=r"routers on layers \[4\] that they do not cover"):
        controller.arm(0, moe_routes, layer_numbers=(1, 2))  # MoE axis numbered 1..M


def test_D5_sequence_parallel_padding_rows_route_natively_and_real_rows_do_not_shift(
    controller: ReplayController,
) -> None:
    from rr_core import pad_rows

    model, layers = replaying_tiny_model(controller)
    routes = random_routes(5, 2)
    padded, mask = pad_rows(routes, torch.ones(5, dtype=torch.bool), 4)
    assert padded.shape[0] == 8
    controller.arm(0, padded, layer_numbers=layers, replay_mask_T=mask)
    model(tokens(8))
    controller.end_step()
    assert torch.equal(model.routed_ids()[:5], routes.long())


def test_arm_batch_replays_a_packed_route_batch(controller: ReplayController) -> None:
    from rr_core import RouteBatch

    model = TinyModel(num_layers=3, moe=[False, True, True])
    layers = controller.attach(model)
    meta = route_meta(E, K, layers=(1, 2, 3), moe=(2, 3))
    seqs = []
    for seed, t in ((1, 3), (2, 4)):
        routes = torch.zeros(t, 3, K, dtype=torch.uint8)
        routes[:, 1:] = random_routes(t, 2, seed)
        seqs.append(routes)
    batch = RouteBatch.from_sequences(
        seqs, meta, valid=[torch.tensor([True, True, False]), torch.ones(4, dtype=torch.bool)]
    )
    controller.set_mode(ReplayMode.REPLAY)
    controller.arm_batch(0, batch)
    model(tokens(7))
    controller.end_step()
    used = model.routed_ids()
    packed = torch.cat(seqs)[:, 1:].long()
    keep = batch.valid_N
    assert torch.equal(used[keep], packed[keep])
    other = RouteBatch.from_sequences(seqs, meta.__class__(**{**meta.__dict__, "num_experts": 7}))
    with pytest.raises(ReplayError, match="captured with E=7, K=2; this model has E=6"):
        controller.arm_batch(1, other)
    assert layers == (2, 3)


def test_replay_mask_reports_the_rows_left_to_the_native_router(
    controller: ReplayController,
) -> None:
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    router = model.moe_layers()[1].router
    assert controller.replay_mask(router) is None  # OFF
    controller.set_mode(ReplayMode.REPLAY)
    mask = torch.tensor([True, False, True])
    controller.arm(4, random_routes(3, 2), layer_numbers=layers, replay_mask_T=mask)
    with controller.microbatch(4):
        assert controller.replay_mask(router) is mask
    assert controller.replay_mask(router) is None  # micro-batch 0: nothing armed
    controller.release(4)
