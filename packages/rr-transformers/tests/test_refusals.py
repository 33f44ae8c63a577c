"""What rr refuses, by name: families it does not know, routers that are not the family's own,
sizes and score functions that do not match, releases outside the supported range, and a MoE
block that stops calling its router (replay must fail, never route natively in silence)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version
from torch import nn

import rr_transformers
from _helpers import FAMILIES
from rr_core import ReplayController, ReplayError, ReplayMode, WalkError
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_config, tiny_model
from rr_transformers import TransformersVersionError, UnknownFamilyError
from rr_transformers._versions import check_transformers_version

pytestmark = pytest.mark.usefixtures("hooks")


def _controller(num_experts: int = NUM_EXPERTS, top_k: int = TOP_K) -> ReplayController:
    return ReplayController(num_experts=num_experts, top_k=top_k)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("phimoe", {"num_local_experts": NUM_EXPERTS}), ("llama", {})],
    ids=["unknown-moe-family", "dense-model"],
)
def test_a_family_rr_does_not_know_is_refused_by_name(model_type, overrides):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    controller = _controller()
    with pytest.raises(UnknownFamilyError, match=f"model_type '{model_type}'.*known: deepseek_v3"):
        rr_transformers.attach(controller, model)
    assert controller.layer_numbers == ()


class RemoteCodeGate(nn.Module):
    """A router some checkpoint's own code defines: rr does not know what it computes."""

    def __init__(self, gate: nn.Module) -> None:
        super().__init__()
        self.weight = gate.weight

    def forward(self, hidden):  # pragma: no cover (refused before any forward)
        raise AssertionError


def test_a_router_that_is_not_the_familys_own_is_refused():
    model = tiny_model("qwen3_moe")
    block = model.get_decoder().layers[1].mlp
    block.gate = RemoteCodeGate(block.gate)
    with pytest.raises(UnknownFamilyError, match=r"decoder layer 1 .* RemoteCodeGate"):
        rr_transformers.attach(_controller(), model)


@pytest.mark.parametrize(
    ("sizes", "match"), [((16, TOP_K), "E=8.*E=16"), ((NUM_EXPERTS, 4), "top-2.*top-4")]
)
def test_sizes_must_match_the_controller(sizes, match):
    with pytest.raises(WalkError, match=match):
        rr_transformers.attach(_controller(*sizes), tiny_model("qwen3_moe"))


@pytest.mark.parametrize("model_type", [t for t in ("deepseek_v3", "gpt_oss") if t in FAMILIES])
def test_the_score_function_must_match_the_routes(model_type):
    with pytest.raises(WalkError, match="recorded with 'softmax'"):
        rr_transformers.attach(_controller(), tiny_model(model_type), score_function="softmax")


def test_attach_takes_a_controller_and_a_model():
    with pytest.raises(ReplayError, match=r"torch.nn.Module .*got 'qwen3_moe' \(str\)"):
        rr_transformers.attach(_controller(), "qwen3_moe")
    with pytest.raises(ReplayError, match=r"ReplayController as its controller; got \{\} \(dict\)"):
        rr_transformers.attach({}, tiny_model("qwen3_moe"))  # type: ignore[arg-type]


def test_the_order_of_earlier_releases_still_attaches_with_a_warning():
    model, controller = tiny_model("qwen3_moe"), _controller()
    with pytest.warns(DeprecationWarning, match=r"attach\(controller, model\)"):
        attachment = rr_transformers.attach(model, controller)  # type: ignore[arg-type]
    try:
        assert attachment.layer_numbers == controller.layer_numbers != ()
        assert attachment.adapter == "transformers"
    finally:
        rr_transformers.detach(controller)
        rr_transformers.uninstall()


@pytest.mark.parametrize(
    ("version", "match"),
    [(None, "not installed"), (Version("4.57.6"), "4.57.6 is outside .*inline")],
)  # fmt: skip  (a newer release is accepted and proven at attach: test_probe.py)
def test_releases_outside_the_range_are_refused(version, match):
    with pytest.raises(TransformersVersionError, match=match):
        check_transformers_version(version)


def test_the_installed_release_is_accepted():
    from rr_transformers._versions import checked_version

    assert checked_version() == rr_transformers.installed_transformers_version()


def _bypass_router(block_class):
    """A hub kernel's stand-in: the MoE block selects experts itself, never calling its
    router (what a replaced forward such as MegaBlocks' does)."""

    def forward(self, hidden_states):
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        logits = nn.functional.linear(flat, self.gate.weight)
        weights, ids = torch.topk(torch.softmax(logits, -1), TOP_K, dim=-1)
        return self.experts(flat, ids, weights).reshape(shape)

    return forward


def test_a_block_that_stops_calling_its_router_fails_the_step():
    model = tiny_model("qwen3_moe")
    block_class = type(model.get_decoder().layers[1].mlp)
    controller = _controller()
    attachment = rr_transformers.attach(controller, model)
    ids = torch.tensor([[3, 4, 5, 6]])
    controller.set_mode(ReplayMode.RECORD)
    with torch.no_grad():
        model(ids)
    recorded = controller.recorded()
    controller.end_step()
    original = block_class.forward
    block_class.forward = _bypass_router(block_class)
    try:
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, recorded, layer_numbers=attachment.layer_numbers)
        with controller.microbatch(0), torch.no_grad():
            model(ids)
        with pytest.raises(ReplayError, match="never"):
            controller.end_step()
    finally:
        block_class.forward = original
        controller.detach()
