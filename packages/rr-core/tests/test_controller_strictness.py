"""The replay controller's strictness: nothing armed, targets of the wrong shape or ids, and
malformed arm inputs raise naming layer and micro-batch (relaxed mode warns instead)."""

from __future__ import annotations

import pytest
import torch

from rr_core import ReplayController, ReplayError, ReplayMode, RRWarning

from rr_core_testing import E, K, TinyModel, random_routes, replaying_tiny_model, tokens


def test_B3_replay_with_nothing_armed_raises(controller: ReplayController) -> None:
    model = TinyModel(num_layers=2)
    controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    with pytest.raises(
        ReplayError, match=r"layer 1 fired in REPLAY for micro-batch 0 but nothing is armed"
    ):
        model(tokens(4))
    controller.end_step()


def test_B3_relaxed_mode_warns_and_routes_natively() -> None:
    model = TinyModel(num_layers=1)
    ctrl = ReplayController(num_experts=E, top_k=K, strict=False)
    try:
        ctrl.attach(model)
        ctrl.set_mode(ReplayMode.REPLAY)
        with pytest.warns(RRWarning, match="routing natively"):
            model(tokens(4))
    finally:
        ctrl.detach()


def test_targets_with_wrong_token_count_raise_naming_layer_and_microbatch(
    controller: ReplayController,
) -> None:
    model, layers = replaying_tiny_model(controller)
    controller.arm(7, random_routes(5, len(layers)), layer_numbers=layers)
    with (
        controller.microbatch(7),
        pytest.raises(
            ReplayError, match=r"layer 1, micro-batch 7: router sees 4 tokens but 5 rows"
        ),
    ):
        model(tokens(4))
    controller.release(7)


@pytest.mark.parametrize(
    ("bad", "message"),
    [(E, rf"ids outside \[0, {E}\)"), ("dup", "repeated expert id")],
)
def test_bad_target_ids_raise_at_arm(
    controller: ReplayController, bad: object, message: str
) -> None:
    model = TinyModel(num_layers=3)
    layers = controller.attach(model)
    routes = random_routes(4, len(layers))
    routes[2, 1] = torch.tensor([E, 0]) if bad == E else torch.tensor([3, 3])
    with pytest.raises(ReplayError, match=rf"micro-batch 0, layer 2, row 2: .*{message}"):
        controller.arm(0, routes, layer_numbers=layers)


def test_bad_ids_on_rows_left_to_the_native_router_are_not_checked(
    controller: ReplayController,
) -> None:
    model = TinyModel(num_layers=1)
    layers = controller.attach(model)
    routes = random_routes(3, 1)
    routes[2] = 0  # no route for the last token: zero-filled and masked out, never replayed
    controller.arm(0, routes, layer_numbers=layers, replay_mask_T=torch.tensor([True, True, False]))
    controller.release(0)


def test_arm_rejects_malformed_inputs(controller: ReplayController) -> None:
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    with pytest.raises(ReplayError, match=r"routes must be \[T, 2, 2\]"):
        controller.arm(0, random_routes(3, 3), layer_numbers=layers)
    with pytest.raises(ReplayError, match="replay mask must be bool"):
        controller.arm(0, random_routes(3, 2), layer_numbers=layers, replay_mask_T=torch.ones(3))
    with pytest.raises(ReplayError, match="repeat a layer"):
        controller.arm(0, random_routes(3, 2), layer_numbers=[1, 1])
    with pytest.raises(ReplayError, match="not attached"):
        controller.route(TinyModel(num_layers=1).moe_layers()[0].router, torch.rand(2, E), K)
