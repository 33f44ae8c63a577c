"""The attach-time probe and the version policy: a release newer than the tested lines is
accepted with one warning and proven on the model at attach; a router whose top-k does not go
through rr's hook, or a block that stops calling its router, fails attach naming the layer; the
probe leaves no trace on the model, the controller or the RNG."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator

import pytest
import torch
from packaging.version import Version
from torch import nn

import rr_transformers
from _helpers import FAMILIES, VERSION, routers
from rr_core import ReplayController, ReplayMode, controller_of
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_model
from rr_transformers import KNOWN_FAMILIES, RouterHookError, TransformersVersionError, _versions

pytestmark = pytest.mark.usefixtures("hooks")

#: A release past the newest tested line, as a user would install the day it ships.
NEWER = Version(f"{_versions.NEWEST_TESTED.major}.{_versions.NEWEST_TESTED.minor + 3}.0")


def _controller() -> ReplayController:
    return ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)


@pytest.fixture
def newer_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The installed transformers reads as :data:`NEWER` (the hooks re-installed for it)."""
    rr_transformers.uninstall()
    _versions.checked_version.cache_clear()
    monkeypatch.setattr(_versions, "installed_transformers_version", lambda: NEWER)
    yield
    rr_transformers.uninstall()
    monkeypatch.undo()
    _versions.checked_version.cache_clear()


@pytest.mark.skipif(
    VERSION.release[:2] != _versions.NEWEST_TESTED.release[:2],
    reason="a newer release is emulated on the newest line's code (older lines lack families)",
)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_newer_release_warns_once_and_attach_proves_the_hooks(newer_release, model_type):
    """Newer than every tested line: not refused. One warning names the newest tested release,
    then attach's probe proves each router replays."""
    model = tiny_model(model_type)
    controller = _controller()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rr_transformers.install()
        attachment = rr_transformers.attach(controller, model)
        rr_transformers.attach(controller, model)  # a second attach: no second warning
    untested = [w for w in caught if issubclass(w.category, _versions.UntestedTransformersWarning)]
    assert len(untested) == 1
    assert f"transformers {NEWER} is newer" in str(untested[0].message)
    assert f"({_versions.NEWEST_TESTED})" in str(untested[0].message)
    assert attachment.layer_numbers == controller.layer_numbers != ()
    rr_transformers.detach(controller)


def test_a_tested_release_does_not_warn():
    _versions.checked_version.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", _versions.UntestedTransformersWarning)
        assert _versions.checked_version() == VERSION


def test_a_release_known_to_break_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(_versions.KNOWN_BROKEN, f"=={NEWER}", "its router drops the top-k call")
    with pytest.raises(TransformersVersionError, match=f"{NEWER} is known to break .*drops"):
        _versions.check_transformers_version(NEWER)
    assert _versions.check_transformers_version(VERSION) == VERSION


def _unhook(model: nn.Module, model_type: str, layer: int) -> None:
    """Layer ``layer``'s routing function becomes the family's own code without rr's wrapper,
    on that one module (what a router selecting with ``Tensor.topk``, or a subclass with its
    own forward, looks like to rr)."""
    family = KNOWN_FAMILIES[model_type]
    _, attribute, on_block = family.hook_names(VERSION)
    router = routers(model, family)[layer]
    blocks = [m for m in model.get_decoder().layers[layer - 1].modules() if m is not router]
    owner = next(m for m in blocks if getattr(m, "gate", None) is router) if on_block else router
    wrapped = getattr(type(owner), attribute).__wrapped__
    setattr(owner, attribute, types.MethodType(wrapped, owner))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_router_that_bypasses_the_hook_fails_attach_naming_the_layer(model_type):
    model = tiny_model(model_type)
    last = max(routers(model, KNOWN_FAMILIES[model_type]))
    _unhook(model, model_type, last)
    controller = _controller()
    with pytest.raises(RouterHookError, match=rf"decoder layer {last - 1} \(global layer {last}\)"):
        rr_transformers.attach(controller, model)
    assert controller.layer_numbers == ()
    assert all(
        controller_of(r) is None for r in routers(model, KNOWN_FAMILIES[model_type]).values()
    )


def test_a_tensor_topk_router_fails_attach_naming_the_layer():
    """Ergo's way of choosing (``scores.topk``, a tensor method) in a Qwen3-MoE router."""
    model = tiny_model("qwen3_moe")
    router = routers(model, KNOWN_FAMILIES["qwen3_moe"])[3]

    def forward(self, hidden_states):
        logits = nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        values, ids = logits.softmax(-1).topk(self.top_k, dim=-1)
        return logits, values / values.sum(-1, keepdim=True), ids

    router.forward = types.MethodType(forward, router)
    with pytest.raises(RouterHookError, match=r"decoder layer 2 \(global layer 3\).*received"):
        rr_transformers.attach(_controller(), model)


def test_a_block_that_stops_calling_its_router_fails_attach():
    model = tiny_model("qwen3_moe")
    block = model.get_decoder().layers[1].mlp

    def forward(self, hidden_states):  # a replaced block (a hub kernel's stand-in)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        weights, ids = torch.topk(torch.softmax(flat @ self.gate.weight.T, -1), TOP_K, dim=-1)
        return self.experts(flat, ids, weights).reshape(hidden_states.shape)

    block.forward = types.MethodType(forward, block)
    with pytest.raises(RouterHookError, match=r"decoder layer 1 \(global layer 2\)"):
        rr_transformers.attach(_controller(), model)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_probe_leaves_nothing_behind(model_type):
    """Weights, buffers, gradients, hooks, the global RNG and the controller are as they were
    (mixtral in training mode with router jitter draws from the RNG in every block forward)."""
    model = tiny_model(model_type)
    if model_type == "mixtral":
        for layer in model.get_decoder().layers:
            layer.mlp.jitter_noise = 0.1
        model.train()
    before, hooks, rng = _state(model), _hook_count(model), torch.get_rng_state()
    controller = _controller()
    attachment = rr_transformers.attach(controller, model)
    assert torch.equal(rng, torch.get_rng_state())
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert _hook_count(model) - hooks <= 1  # the packed-forward guard on the decoder, no more
    assert all(controller.mode_of(layer) is ReplayMode.OFF for layer in attachment.layer_numbers)
    report = controller.end_step()
    assert not report.agreement
    assert not report.replayed_microbatches
    assert not report.recorded_microbatches
    assert all(
        controller_of(r) is controller for r in routers(model, KNOWN_FAMILIES[model_type]).values()
    )
    rr_transformers.detach(controller)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_a_users_hooks_do_not_see_the_probe(model_type):
    """Expert-load statistics kept by a user's hooks count the model's own forwards only: the
    probe's block forwards reach no hook of the model, and every hook is still there after."""
    model = tiny_model(model_type)
    calls: list[str] = []
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda *_args, name=name: calls.append(name))
        module.register_forward_hook(lambda *_args, name=name: calls.append(name))
    hooks = _hook_count(model)
    controller = _controller()
    rr_transformers.attach(controller, model)
    assert calls == []
    assert _hook_count(model) - hooks <= 1  # the packed-forward guard on the decoder, no more
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert any("experts" in name for name in calls)  # the hooks are live again
    rr_transformers.detach(controller)


def test_re_attaching_the_same_model_proves_it_again():
    model, controller = tiny_model("qwen3_moe"), _controller()
    first = rr_transformers.attach(controller, model)
    second = rr_transformers.attach(controller, model)
    assert first.layer_numbers == second.layer_numbers == controller.layer_numbers
    rr_transformers.detach(controller)


def test_routers_of_another_controller_are_refused_by_attach_not_the_probe():
    model, owner = tiny_model("qwen3_moe"), _controller()
    rr_transformers.attach(owner, model)
    with pytest.raises(Exception, match="already attached to another controller"):
        rr_transformers.attach(_controller(), model)
    assert owner.layer_numbers != ()
    rr_transformers.detach(owner)
