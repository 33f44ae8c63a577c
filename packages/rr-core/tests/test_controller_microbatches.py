"""The replay controller's micro-batch lifecycle: forward-only passes, unconsumed targets, and
recompute taking its own micro-batch's routes in any schedule order."""

from __future__ import annotations

import pytest
import torch

from rr_core import ReplayController, ReplayError, ReplayMode

from rr_core_testing import E, K, TinyModel, random_routes, replaying_tiny_model, tokens


def test_B2_forward_only_pass_leaves_nothing_behind(controller: ReplayController) -> None:
    model, layers = replaying_tiny_model(controller)
    old = random_routes(4, len(layers), seed=10)
    controller.arm(0, old, layer_numbers=layers)
    with torch.no_grad():  # log-prob pass
        model(tokens(4))
    with pytest.raises(ReplayError, match="still armed from an earlier pass"):
        controller.arm(0, old, layer_numbers=layers)
    controller.end_step()
    new = random_routes(4, len(layers), seed=11)
    controller.arm(0, new, layer_numbers=layers)
    model(tokens(4)).sum().backward()
    controller.end_step()
    assert torch.equal(model.routed_ids(), new.long())


def test_unconsumed_targets_raise_at_step_end_and_state_is_cleared(
    controller: ReplayController,
) -> None:
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY, layers=[layers[0]])
    controller.arm(3, random_routes(4, len(layers)), layer_numbers=layers)
    with pytest.raises(ReplayError, match=r"never used .*\{3: \[1, 2\]\}"):
        controller.end_step()
    assert controller.end_step().replayed_microbatches == ()


@pytest.mark.parametrize("recompute", ["reentrant", "non_reentrant"])
def test_B1_recompute_uses_its_own_microbatch_in_any_schedule_order(
    controller: ReplayController, recompute: str
) -> None:
    """Interleaved schedules run backward in another order than forward; a FIFO of targets
    would hand micro-batch 0's routes to micro-batch 2's recompute."""
    model = TinyModel(num_layers=3, recompute=recompute)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    routes = {mb: random_routes(6, len(layers), seed=mb) for mb in range(3)}
    inputs = {mb: tokens(6, seed=100 + mb) for mb in range(3)}
    outputs = {}
    for mb in range(3):
        controller.arm(mb, routes[mb], layer_numbers=layers)
        outputs[mb] = controller.run_microbatch(mb, model, inputs[mb])
    for mb in (2, 0, 1):
        outputs[mb].sum().backward()
        assert torch.equal(model.routed_ids(), routes[mb].long()), f"recompute of {mb}"
    controller.end_step()

    # The gradients equal those of a run without recompute.
    grads = [p.grad.clone() for p in model.parameters()]
    reference = TinyModel(num_layers=3)
    reference.load_state_dict(model.state_dict())
    ref_ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        ref_ctrl.attach(reference)
        ref_ctrl.set_mode(ReplayMode.REPLAY)
        for mb in range(3):
            ref_ctrl.arm(mb, routes[mb], layer_numbers=layers)
            with ref_ctrl.microbatch(mb):
                reference(inputs[mb]).sum().backward()
        ref_ctrl.end_step()
    finally:
        ref_ctrl.detach()
    for got, want in zip(grads, [p.grad for p in reference.parameters()], strict=True):
        assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("recompute", ["reentrant", "non_reentrant"])
@pytest.mark.parametrize("post", ["view_div_", "transpose_mul_", "softcap_"])
def test_B1_tracked_output_modified_in_place_still_names_its_microbatch(
    controller: ReplayController, recompute: str, post: str
) -> None:
    """Trainers post-process logits in place (temperature, softcapping), often on a view of
    the model's output (batch size 1 THD: ``[S, 1, V]`` transposed). A hook on that tensor is
    lost with the view's node; the mark must survive whatever happens after tracking."""
    model = TinyModel(num_layers=3, recompute=recompute)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    routes = {mb: random_routes(6, len(layers), seed=mb) for mb in range(2)}
    outputs = {}
    for mb in range(2):
        controller.arm(mb, routes[mb], layer_numbers=layers)
        with controller.microbatch(mb) as scope:
            logits = model(tokens(6, seed=100 + mb)).unsqueeze(1).transpose(0, 1)  # a view
            scope.track(logits)
        if post == "view_div_":
            logits.div_(0.7)
        elif post == "transpose_mul_":
            logits = logits.transpose(0, 1)
            logits.mul_(2.0)
        else:
            logits.copy_(torch.tanh(logits / 3.0) * 3.0)  # softcapping, written in place
        outputs[mb] = logits
    for mb in (1, 0):
        outputs[mb].sum().backward()
        assert torch.equal(model.routed_ids(), routes[mb].long()), f"recompute of {mb}"
    controller.end_step()


def test_recompute_with_several_untracked_microbatches_raises(controller: ReplayController) -> None:
    model = TinyModel(num_layers=1, recompute="non_reentrant")
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    outs = []
    for mb in range(2):
        controller.arm(mb, random_routes(3, 1, seed=mb), layer_numbers=layers)
        with controller.microbatch(mb):
            outs.append(model(tokens(3)))
    with pytest.raises(ReplayError, match="2 micro-batches ran forward this step"):
        outs[1].sum().backward()
    with controller.backward(1):
        outs[1].sum().backward()
    assert torch.equal(model.routed_ids(), random_routes(3, 1, seed=1).long())
    with controller.backward(0):
        outs[0].sum().backward()
    controller.end_step()


def test_record_mode_recompute_routes_as_the_forward_did(controller: ReplayController) -> None:
    model = TinyModel(num_layers=2, recompute="reentrant")
    controller.attach(model)
    controller.set_mode(ReplayMode.RECORD)
    out = model(tokens(5))
    recorded = controller.recorded()
    with torch.no_grad():  # perturb weights: a native recompute would now route differently
        for layer in model.moe_layers():
            layer.router.weight.mul_(-1)
    out.sum().backward()
    assert torch.equal(model.routed_ids(), recorded)
    controller.end_step()


def test_record_twice_for_one_microbatch_raises(controller: ReplayController) -> None:
    model = TinyModel(num_layers=1)
    controller.attach(model)
    controller.set_mode(ReplayMode.RECORD)
    with torch.no_grad():
        model(tokens(2))
        with pytest.raises(ReplayError, match="recorded twice for micro-batch 0"):
            model(tokens(2))
    controller.end_step()
