"""The replay controller's attachment: only attached models replay, a new model releases the old
one, a router belongs to one controller, and router geometry must match."""

from __future__ import annotations

import pytest
import torch

from rr_core import ReplayController, ReplayError, ReplayMode

from rr_core_testing import E, K, TinyModel, random_routes, tokens


def test_C5_models_that_are_not_attached_never_replay(controller: ReplayController) -> None:
    policy, reference = TinyModel(num_layers=2, seed=1), TinyModel(num_layers=2, seed=1)
    layers = controller.attach(policy)
    controller.set_mode(ReplayMode.REPLAY)
    routes = random_routes(4, len(layers))
    controller.arm(0, routes, layer_numbers=layers)
    x = tokens(4)
    policy(x)
    reference(x)  # same layer numbers, same process: must route natively, and raise nothing
    controller.end_step()
    native = torch.stack(
        [torch.topk(layer.router.last_scores_TE, K).indices for layer in reference.moe_layers()], 1
    )
    assert torch.equal(reference.routed_ids(), native)
    assert torch.equal(policy.routed_ids(), routes.long())


def test_B5_attaching_a_new_model_releases_the_old_one(controller: ReplayController) -> None:
    first, second = TinyModel(num_layers=2), TinyModel(num_layers=2)
    layers = controller.attach(first)
    controller.set_mode(ReplayMode.REPLAY)
    controller.arm(0, random_routes(3, 2), layer_numbers=layers)
    assert controller.attach(second) == layers
    assert controller.end_step().replayed_microbatches == ()  # targets died with the old model
    first(tokens(3))  # routes natively, no controller
    assert controller.mode_of(1) is ReplayMode.OFF


def test_one_router_cannot_belong_to_two_controllers(controller: ReplayController) -> None:
    model = TinyModel(num_layers=1)
    controller.attach(model)
    other = ReplayController(num_experts=E, top_k=K)
    with pytest.raises(ReplayError, match="already attached to another controller"):
        other.attach(model)


def test_router_geometry_mismatch_raises(controller: ReplayController) -> None:
    model = TinyModel(num_layers=1, num_experts=E + 1)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    controller.arm(0, random_routes(2, 1), layer_numbers=layers)
    with pytest.raises(ReplayError, match=rf"layer 1: router gave scores \[2, {E + 1}\]"):
        model(tokens(2))
    controller.release(0)
