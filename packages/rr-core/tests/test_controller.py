"""The replay controller on tiny real-autograd models: equivalence, strictness, lifecycle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import ReplayController, ReplayError, ReplayMode, RRWarning
from rr_fakes import distinct_ids

from rr_core_testing import E, H, K, TinyModel


def tokens(t: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(t, H, generator=torch.Generator().manual_seed(seed))


def random_routes(t: int, layers: int, seed: int = 2) -> torch.Tensor:
    """``[t, layers, K]`` distinct ids per row, uint8 like a compact route batch."""
    return distinct_ids(t, layers, num_experts=E, top_k=K, seed=seed, dtype=torch.uint8)


def _replaying(controller: ReplayController) -> tuple[TinyModel, tuple[int, ...]]:
    """A two-layer TinyModel attached to ``controller``, which is set to replay, and its
    layer numbers."""
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    return model, layers


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
    model, layers = _replaying(controller)
    controller.arm(0, random_routes(64, len(layers)), layer_numbers=layers)
    model(tokens(64))
    agreement = controller.agreement()
    controller.end_step()
    assert set(agreement) == set(layers)
    assert all(0.0 <= share < 0.5 for share in agreement.values()), agreement


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
    model, layers = _replaying(controller)
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


def test_B2_forward_only_pass_leaves_nothing_behind(controller: ReplayController) -> None:
    model, layers = _replaying(controller)
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

    model, layers = _replaying(controller)
    routes = random_routes(5, 2)
    padded, mask = pad_rows(routes, torch.ones(5, dtype=torch.bool), 4)
    assert padded.shape[0] == 8
    controller.arm(0, padded, layer_numbers=layers, replay_mask_T=mask)
    model(tokens(8))
    controller.end_step()
    assert torch.equal(model.routed_ids()[:5], routes.long())


def test_arm_batch_replays_a_packed_route_batch(controller: ReplayController) -> None:
    from rr_core import RouteBatch, RouteMeta

    model = TinyModel(num_layers=3, moe=[False, True, True])
    layers = controller.attach(model)
    meta = RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis="all_layers",
        layer_numbers=(1, 2, 3),
        moe_layer_numbers=(2, 3),
    )
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
