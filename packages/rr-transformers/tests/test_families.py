"""Record -> replay exactness on a real tiny model of every family the installed release has.

Each test builds the model from a config object (rr_fakes.shims.hf_models), so it runs the family's
own modeling code: its router, its MoE block, its experts.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import rr_transformers
from _helpers import (
    FAMILIES,
    check_replayed_weights,
    expert_inputs,
    replaying_moved_routers,
    same_sets,
)
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, perturb_routers, tiny_model

pytestmark = pytest.mark.usefixtures("hooks")


def _tokens(seed: int = 0, shape: tuple[int, int] = (2, 9)) -> torch.Tensor:
    return torch.randint(3, 90, shape, generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def _attached(model):
    """A controller attached to ``model`` and its attachment; detached on exit."""
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    try:
        yield controller, attachment
    finally:
        controller.detach()


def _record(model, controller, ids):
    controller.set_mode(ReplayMode.RECORD)
    with torch.no_grad():
        out = model(ids).logits
    recorded = controller.recorded()
    controller.end_step()
    return out, recorded


@pytest.mark.parametrize("model_type", FAMILIES)
def test_hooks_change_nothing_until_replay(model_type):
    """Installed, attached and recording, the model computes bit for bit what it computed
    without rr: the family's own arithmetic runs around the routed top-k call."""
    model = tiny_model(model_type)
    ids = _tokens()
    rr_transformers.uninstall()
    with torch.no_grad():
        plain = model(ids).logits
    rr_transformers.install()
    with _attached(model) as (controller, attachment):
        with torch.no_grad():
            attached_off = model(ids).logits
        recorded_out, recorded = _record(model, controller, ids)
    assert torch.equal(plain, attached_off)
    assert torch.equal(plain, recorded_out)
    assert recorded.shape == (ids.numel(), len(attachment.layer_numbers), TOP_K)
    assert attachment.model_type == model_type


@pytest.mark.parametrize("model_type", FAMILIES)
def test_replay_forces_recorded_sets_with_the_trainers_own_weights(model_type):
    """After the router weights move, replay feeds each layer's experts exactly the recorded
    sets, with gate weights from the moved router's own scores at those experts (the family's
    semantics, checked against a reference written from rr's family table), and the router
    receives gradient."""
    family = rr_transformers.KNOWN_FAMILIES[model_type]
    model = tiny_model(model_type)
    ids = _tokens(1)
    with _attached(model) as (controller, attachment):
        _, recorded = _record(model, controller, ids)
        with replaying_moved_routers(model, family, controller, recorded) as (seen, hidden):
            out = model(ids).logits
        out.float().square().mean().backward()
        report = controller.end_step()
    assert sorted(seen) == list(attachment.layer_numbers)
    by_router = check_replayed_weights(
        model, family, seen, hidden, recorded, attachment.layer_numbers
    )
    for layer in attachment.layer_numbers:
        assert by_router[layer].weight.grad is not None
        assert by_router[layer].weight.grad.abs().sum() > 0
    assert min(report.agreement.values()) < 1.0  # the perturbation moved some rows


@pytest.mark.parametrize("model_type", FAMILIES)
def test_rows_outside_the_replay_mask_route_natively(model_type):
    family = rr_transformers.KNOWN_FAMILIES[model_type]
    model = tiny_model(model_type)
    ids = _tokens(2, (1, 12))
    with _attached(model) as (controller, attachment):
        _, recorded = _record(model, controller, ids)
        perturb_routers(model)
        _, native = _record(model, controller, ids)
        mask_T = torch.arange(ids.numel()) % 3 != 0
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, recorded, layer_numbers=attachment.layer_numbers, replay_mask_T=mask_T)
        with expert_inputs(model) as seen, torch.no_grad():
            model(ids)
        controller.end_step()
    for slot, layer in enumerate(attachment.layer_numbers):
        ((ids_TK, _),) = seen[layer]
        assert same_sets(ids_TK[mask_T], recorded[mask_T, slot])
        assert same_sets(ids_TK[~mask_T], native[~mask_T, slot])
    assert family.model_type == model_type


@pytest.mark.parametrize("model_type", FAMILIES)
def test_replay_with_unchanged_weights_reproduces_the_forward_bit_for_bit(model_type):
    model = tiny_model(model_type)
    ids = _tokens(3)
    with _attached(model) as (controller, attachment):
        reference, recorded = _record(model, controller, ids)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, recorded, layer_numbers=attachment.layer_numbers)
        with torch.no_grad():
            replayed = model(ids).logits
        report = controller.end_step()
    assert torch.equal(reference, replayed)
    assert set(report.agreement.values()) == {1.0}
