"""The MoE model types transformers 5.25 added, on its real classes: Param2-MoE replays as the
GLM-4-MoE family whose code it runs; Ergo, whose router selects with a tensor method rr cannot
route, is refused by name."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rr_transformers
from _helpers import VERSION, check_replayed_weights, replaying_moved_routers, routers
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.hf_models import (
    FAMILY_CONFIGS,
    NUM_EXPERTS,
    TOP_K,
    tiny_config,
    tiny_model,
)
from rr_transformers import KNOWN_FAMILIES, UnknownFamilyError

pytestmark = [
    pytest.mark.usefixtures("hooks"),
    pytest.mark.skipif(Version("5.25") > VERSION, reason="model types of transformers 5.25"),
]


def _param2moe() -> torch.nn.Module:
    """A tiny Param2-MoE (GLM-4-MoE's tiny sizes; its rotary embedding covers the full head)."""
    sizes = {k: v for k, v in FAMILY_CONFIGS["glm4_moe"].items() if k != "partial_rotary_factor"}
    return tiny_model("param2moe", **sizes)


def test_param2moe_replays_as_glm4_moe():
    """Param2-MoE's routers are GLM-4-MoE's class: attach takes them as that family, and a
    replay after the router weights moved feeds the experts the recorded sets with GLM-4-MoE's
    gate weights (sigmoid, expert bias for the choice only, renormalised, scaled)."""
    model = _param2moe()
    family = KNOWN_FAMILIES["glm4_moe"]
    assert type(model).__name__ == "Glm4MoeForCausalLM"
    assert model.config.model_type == "param2moe"
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    try:
        assert attachment.family is family
        assert attachment.model_type == "glm4_moe"
        assert attachment.layer_numbers == tuple(routers(model, family)) == (2, 3)
        ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
        controller.set_mode(ReplayMode.RECORD)
        with torch.no_grad():
            model(ids)
        recorded = controller.recorded()
        controller.end_step()
        with (
            replaying_moved_routers(model, family, controller, recorded) as (seen, hidden),
            torch.no_grad(),
        ):
            model(ids)
        report = controller.end_step()
    finally:
        controller.detach()
    assert sorted(seen) == list(attachment.layer_numbers)
    check_replayed_weights(model, family, seen, hidden, recorded, attachment.layer_numbers)
    assert min(report.agreement.values()) < 1.0  # the moved weights would have chosen others


def test_ergo_is_refused_by_name():
    from transformers import AutoModelForCausalLM

    config = tiny_config(
        "ergo", num_experts=NUM_EXPERTS, moe_intermediate_size=16, shared_intermediate_size=16,
        first_dense_intermediate_size=48, global_attention_every_n_layers=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    with pytest.raises(UnknownFamilyError, match=r"model_type 'ergo'\) is refused: .*\.topk"):
        rr_transformers.attach(controller, model)
    assert controller.layer_numbers == ()
