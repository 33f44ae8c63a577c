"""Replay under activation checkpointing: transformers' ``gradient_checkpointing_enable``
(non-reentrant and reentrant) and torch's ``checkpoint_wrapper`` on each decoder layer.

The recompute inside backward runs each layer's router again. It must select exactly what the
forward selected (the armed routes in REPLAY, the recorded ones in RECORD), or the experts get
other tokens, the gradients change, and torch's non-reentrant checkpoint, which compares the
tensors saved in the forward with those the recompute saves, raises ``CheckpointError`` (the
eager expert loop saves one tensor per expert hit, sized by its token count).

Gradients are compared bit for bit with the same step run without checkpointing: the recompute
runs the same CPU kernels on the same inputs in the same order, and replay makes the routing,
hence every expert's token set, identical, so each gradient is the same sum in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointError

import rr_transformers
from _helpers import FAMILIES, expert_inputs, same_sets
from rr_core import ReplayController, ReplayMode, StepReport
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, perturb_routers, routers_of, tiny_model

pytestmark = [
    pytest.mark.usefixtures("hooks"),
    # 5.24 renamed it activation_checkpointing_enable; trainers still call the old name
    pytest.mark.filterwarnings(
        "ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning"
    ),
]

#: every family for the main test, these four (one of each router kind) for the others
CHECKPOINT_FAMILIES = [
    f for f in ("qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next") if f in FAMILIES
]
METHODS = ("hf_non_reentrant", "hf_reentrant", "torch_wrapper")
#: grouped_mm (the default) saves fixed shapes; the eager loop saves one tensor per expert hit
EXPERTS = ("grouped_mm", "eager")

Batches = Mapping[int, torch.Tensor]  # micro-batch -> input ids [B, S]
Routes = Mapping[int, torch.Tensor]  # micro-batch -> routes [B*S, L, K]


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(seed))


def _model(model_type: str, experts: str = "grouped_mm") -> nn.Module:
    return tiny_model(model_type, experts_implementation=experts).train()


def enable_checkpointing(model: nn.Module, method: str) -> None:
    """Checkpoint every decoder layer the way a trainer does it."""
    if method == "torch_wrapper":
        layers = set(rr_transformers.decoder_layers(model))
        wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=wrap, check_fn=layers.__contains__
        )
        return
    if method == "hf_reentrant":
        # a frozen embedding (adapter training): only transformers' enable_input_require_grads,
        # which gradient_checkpointing_enable calls, gives the reentrant checkpoint an input
        # that requires grad; without it no layer parameter would get a gradient
        model.get_input_embeddings().requires_grad_(False)
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": method == "hf_reentrant"}
    )


@dataclass
class Step:
    """One training step: what each layer's experts received, forward and recompute (in call
    order), the gradients by parameter name, the logits and the controller's report."""

    forward: dict[int, list[torch.Tensor]]
    recompute: dict[int, list[torch.Tensor]]
    grads: dict[str, torch.Tensor]
    logits: dict[int, torch.Tensor]
    recorded: dict[int, torch.Tensor]
    report: StepReport


def _loss(logits_BSV: torch.Tensor, ids_BS: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits_BSV[:, :-1].flatten(0, 1), ids_BS[:, 1:].flatten())


def train_step(
    model: nn.Module,
    controller: ReplayController,
    batches: Batches,
    *,
    armed: Routes | None = None,
    between: Callable[[], None] | None = None,
) -> Step:
    """Forward every micro-batch in order, then backward them in reverse (gradient
    accumulation). With ``armed`` the routers replay those routes, else they record.
    ``between`` runs after the forwards, before the backwards. No KV cache, as trainers do:
    under torch's checkpoint_wrapper the recompute would append to it a second time."""
    model.zero_grad(set_to_none=True)
    controller.set_mode(ReplayMode.RECORD if armed is None else ReplayMode.REPLAY)
    for mb, routes_NLK in (armed or {}).items():
        controller.arm(mb, routes_NLK, layer_numbers=controller.layer_numbers)
    losses, logits = {}, {}
    with expert_inputs(model) as seen:
        for mb, ids_BS in batches.items():
            with controller.microbatch(mb) as scope:
                out = model(input_ids=ids_BS, use_cache=False).logits
                scope.track(out)
            losses[mb], logits[mb] = _loss(out, ids_BS), out.detach()
        forward = {layer: [ids for ids, _ in calls] for layer, calls in seen.items()}
        if between is not None:
            between()
        for mb in reversed(list(batches)):
            losses[mb].backward()
    recompute = {
        layer: [ids for ids, _ in calls[len(forward[layer]) :]] for layer, calls in seen.items()
    }
    recorded = {} if armed is not None else {mb: controller.recorded(mb) for mb in batches}
    report = controller.end_step()
    grads = {
        name.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    return Step(forward, recompute, grads, logits, recorded, report)


def record(
    model: nn.Module, controller: ReplayController, batches: Batches
) -> dict[int, torch.Tensor]:
    """The old policy's forward: no grad, RECORD, one micro-batch per key."""
    controller.set_mode(ReplayMode.RECORD)
    with torch.no_grad():
        for mb, ids_BS in batches.items():
            with controller.microbatch(mb):
                model(input_ids=ids_BS)
    recorded = {mb: controller.recorded(mb) for mb in batches}
    controller.end_step()
    return recorded


def assert_experts_received(
    step: Step, routes: Routes, layers: tuple[int, ...], *, recompute: bool
) -> None:
    """Each layer's experts got exactly ``routes`` (as sets) in the forward, micro-batches in
    order, and, with checkpointing, again in the recompute, micro-batches in backward order."""
    order = list(routes)
    assert sorted(step.forward) == list(layers)
    for slot, layer in enumerate(layers):
        assert len(step.forward[layer]) == len(order), f"layer {layer}"
        for mb, ids_TK in zip(order, step.forward[layer], strict=True):
            assert same_sets(ids_TK, routes[mb][:, slot]), f"forward, layer {layer}, mb {mb}"
        expected = order[::-1] if recompute else []
        assert len(step.recompute[layer]) == len(expected), f"recompute count, layer {layer}"
        for mb, ids_TK in zip(expected, step.recompute[layer], strict=True):
            assert same_sets(ids_TK, routes[mb][:, slot]), f"recompute, layer {layer}, mb {mb}"


def assert_same_grads(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> None:
    assert sorted(actual) == sorted(expected)
    different = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not different, f"gradients differ from the step without checkpointing: {different}"


def assert_routers_learn(model: nn.Module) -> None:
    for router in routers_of(model):
        assert router.weight.grad is not None
        assert router.weight.grad.abs().sum() > 0


def _replay_setup(
    model_type: str, experts: str, batches: Batches
) -> tuple[nn.Module, ReplayController, rr_transformers.Attachment, dict[int, torch.Tensor]]:
    """A model whose routes were recorded on ``batches`` and whose routers then moved."""
    model = _model(model_type, experts)
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    routes = record(model, controller, batches)
    perturb_routers(model)  # the policy moved since the routes were recorded
    return model, controller, attachment, routes


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_replay_under_checkpointing_matches_the_step_without(model_type, method, experts):
    batches = {0: _tokens(0)}
    model, controller, attachment, routes = _replay_setup(model_type, experts, batches)
    try:
        plain = train_step(model, controller, batches, armed=routes)
        enable_checkpointing(model, method)
        layers = rr_transformers.attach(controller, model).layer_numbers  # on the wrapped layers
        checkpointed = train_step(model, controller, batches, armed=routes)
    finally:
        controller.detach()
    assert layers == attachment.layer_numbers
    assert_experts_received(plain, routes, layers, recompute=False)
    assert_experts_received(checkpointed, routes, layers, recompute=True)
    expected = plain.grads
    if method == "hf_reentrant":  # the embedding is frozen there
        expected = {n: g for n, g in expected.items() if "embed_tokens" not in n}
    assert_same_grads(checkpointed.grads, expected)
    assert_routers_learn(model)
    assert min(checkpointed.report.agreement.values()) < 1.0  # replay changed some rows


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", CHECKPOINT_FAMILIES)
def test_gradient_accumulation_recomputes_each_microbatch_with_its_own_routes(model_type, method):
    """Forward m0, forward m1, backward m1, backward m0: each recompute finds its micro-batch
    from the tracked output and replays that micro-batch's routes, not the last armed ones."""
    batches = {0: _tokens(10), 1: _tokens(11)}
    model, controller, attachment, routes = _replay_setup(model_type, "eager", batches)
    assert not torch.equal(routes[0], routes[1])
    try:
        plain = train_step(model, controller, batches, armed=routes)
        enable_checkpointing(model, method)
        checkpointed = train_step(model, controller, batches, armed=routes)
    finally:
        controller.detach()
    assert_experts_received(checkpointed, routes, attachment.layer_numbers, recompute=True)
    expected = plain.grads
    if method == "hf_reentrant":
        expected = {n: g for n, g in expected.items() if "embed_tokens" not in n}
    assert_same_grads(checkpointed.grads, expected)
    assert checkpointed.report.replayed_microbatches == (0, 1)


@pytest.mark.parametrize("model_type", CHECKPOINT_FAMILIES)
def test_r2_record_in_the_old_policy_forward_then_replay_in_the_checkpointed_update(model_type):
    """R2: the no-grad old-policy forward records; the update replays it under checkpointing.
    On unchanged weights the update reproduces the old policy's logits bit for bit; after the
    policy moves it still feeds the experts the recorded sets, forward and recompute."""
    model = _model(model_type, "eager")
    enable_checkpointing(model, "hf_non_reentrant")  # inactive under no_grad, as in trainers
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    layers = rr_transformers.attach(controller, model).layer_numbers
    batches = {0: _tokens(20), 1: _tokens(21)}
    try:
        controller.set_mode(ReplayMode.RECORD)
        old_logits = {}
        with torch.no_grad():
            for mb, ids_BS in batches.items():
                with controller.microbatch(mb):
                    old_logits[mb] = model(input_ids=ids_BS).logits
        routes = {mb: controller.recorded(mb) for mb in batches}
        controller.end_step()
        first = train_step(model, controller, batches, armed=routes)
        perturb_routers(model)
        later = train_step(model, controller, batches, armed=routes)
    finally:
        controller.detach()
    for mb in batches:
        assert torch.equal(first.logits[mb], old_logits[mb])
    assert set(first.report.agreement.values()) == {1.0}
    assert_experts_received(first, routes, layers, recompute=True)
    assert_experts_received(later, routes, layers, recompute=True)
    assert min(later.report.agreement.values()) < 1.0
    assert_routers_learn(model)


@pytest.mark.parametrize(
    "method",
    [
        "hf_non_reentrant",
        "hf_reentrant",  # torch checks nothing there; the gradients still match
        "torch_wrapper",
    ],
)
@pytest.mark.parametrize("model_type", CHECKPOINT_FAMILIES)
def test_record_under_checkpointing_recomputes_the_recorded_routes(model_type, method):
    """RECORD in a checkpointed training step: the recompute routes as the forward did (it
    neither records twice nor routes anew), and the step's gradients equal the step without
    checkpointing."""
    batches = {0: _tokens(30), 1: _tokens(31)}
    model = _model(model_type, "eager")
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    layers = rr_transformers.attach(controller, model).layer_numbers
    try:
        plain = train_step(model, controller, batches)
        enable_checkpointing(model, method)
        checkpointed = train_step(model, controller, batches)
    finally:
        controller.detach()
    for mb in batches:
        assert torch.equal(checkpointed.recorded[mb], plain.recorded[mb])
    assert_experts_received(checkpointed, checkpointed.recorded, layers, recompute=True)
    expected = plain.grads
    if method == "hf_reentrant":
        expected = {n: g for n, g in expected.items() if "embed_tokens" not in n}
    assert_same_grads(checkpointed.grads, expected)
    assert checkpointed.report.recorded_microbatches == (0, 1)


def _move_router_numerics(model: nn.Module) -> None:
    """Change the router weights' values without autograd seeing it, as a recompute whose
    kernels round differently from the forward's would: native routing then differs."""
    generator = torch.Generator().manual_seed(7)
    for router in routers_of(model):
        router.weight.data.add_(torch.randn(router.weight.shape, generator=generator) * 0.3)


@pytest.mark.parametrize("mode", [ReplayMode.RECORD, ReplayMode.REPLAY])
@pytest.mark.parametrize("model_type", CHECKPOINT_FAMILIES)
def test_recompute_routes_as_the_forward_did_when_router_numerics_move(model_type, mode):
    batches = {0: _tokens(40)}
    if mode is ReplayMode.REPLAY:
        model, controller, attachment, armed = _replay_setup(model_type, "eager", batches)
    else:
        model = _model(model_type, "eager")
        controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
        attachment, armed = rr_transformers.attach(controller, model), None
    enable_checkpointing(model, "hf_non_reentrant")
    try:
        step = train_step(
            model, controller, batches, armed=armed, between=lambda: _move_router_numerics(model)
        )
    finally:
        controller.detach()
    routes = step.recorded if armed is None else armed
    assert_experts_received(step, routes, attachment.layer_numbers, recompute=True)


@pytest.mark.parametrize("model_type", CHECKPOINT_FAMILIES)
def test_control_native_recompute_with_moved_numerics_raises_checkpoint_error(model_type):
    """Without replay the same step fails torch's check (the failure trainers report as
    "CheckpointError: N vs M tensors"), so the tests above would catch a recompute that
    routed anew."""
    model = _model(model_type, "eager")
    enable_checkpointing(model, "hf_non_reentrant")
    ids_BS = _tokens(40)
    loss = _loss(model(input_ids=ids_BS, use_cache=False).logits, ids_BS)
    _move_router_numerics(model)
    with pytest.raises(CheckpointError, match=r"different metadata|number of tensors"):
        loss.backward()
