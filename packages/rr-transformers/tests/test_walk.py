"""What attach walks: the text decoder's routed layers by number, never a vision tower or a
router hung outside the decoder (an MTP head), and dense layers never."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import rr_transformers
from _helpers import FAMILIES, expert_inputs, same_sets
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_config, tiny_model

pytestmark = pytest.mark.usefixtures("hooks")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_layer_numbers_are_the_decoder_layers_holding_the_familys_router(model_type):
    model = tiny_model(model_type)
    family = rr_transformers.KNOWN_FAMILIES[model_type]
    layers = rr_transformers.decoder_layers(model)
    routed = tuple(
        i + 1
        for i, layer in enumerate(layers)
        if any(type(m) is family.router_class() for m in layer.modules())
    )
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    try:
        attachment = rr_transformers.attach(controller, model)
    finally:
        controller.detach()
    assert attachment.layer_numbers == routed == controller_layers(model_type)
    assert attachment.num_layers == len(layers) == 3


def controller_layers(model_type: str) -> tuple[int, ...]:
    """The routed layers the tiny configs declare: a dense first layer where the family has one
    (``mlp_only_layers`` / ``first_k_dense_replace``)."""
    config = tiny_config(model_type)
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    dense |= set(range(getattr(config, "first_k_dense_replace", 0) or 0))
    return tuple(i + 1 for i in range(config.num_hidden_layers) if i not in dense)


@pytest.mark.skipif("qwen3_5_moe_text" not in FAMILIES, reason="Qwen3.5-MoE arrived in 5.2")
def test_a_vision_language_model_is_walked_on_its_language_model_only():
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    vision = {
        "depth": 2, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 32,
        "intermediate_size": 32, "patch_size": 4, "spatial_merge_size": 1,
        "temporal_patch_size": 1,
    }  # fmt: skip
    config = Qwen3_5MoeConfig(
        text_config=tiny_config("qwen3_5_moe_text").to_dict(), vision_config=vision
    )
    model = Qwen3_5MoeForConditionalGeneration(config)
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    try:
        attachment = rr_transformers.attach(controller, model)
    finally:
        controller.detach()
    assert attachment.model_type == "qwen3_5_moe_text"
    assert attachment.layer_numbers == (1, 2, 3)


class NextTokenHead(nn.Module):
    """A multi-token-prediction head outside the decoder, holding a copy of a decoder layer."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = copy.deepcopy(layer)


def test_a_router_outside_the_decoder_is_not_attached_and_routes_natively():
    model = tiny_model("qwen3_moe")
    decoder = model.get_decoder()
    model.mtp = NextTokenHead(decoder.layers[2])
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    try:
        assert attachment.layer_numbers == (2, 3)
        head_router = model.mtp.layer.mlp.gate
        x = torch.randn(5, decoder.config.hidden_size)
        native = head_router(x)[2]
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, torch.zeros(5, 2, TOP_K, dtype=torch.long) + torch.tensor([0, 1]),
                       layer_numbers=attachment.layer_numbers)  # fmt: skip
        with torch.no_grad():
            assert torch.equal(head_router(x)[2], native)  # not attached: native, never armed
            with expert_inputs(model) as seen:
                model(torch.tensor([[3, 4, 5, 6, 7]]))
        controller.end_step()
        for layer in attachment.layer_numbers:
            ((ids_TK, _),) = seen[layer]
            assert same_sets(ids_TK, torch.tensor([[0, 1]] * 5))
    finally:
        controller.detach()
