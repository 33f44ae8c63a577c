"""What the emulated MindSpeed's tests share: a throw-away module standing in for Megatron's
router, moe_utils and moe_layer (the ``Targets`` they patch), and the installed line."""

from __future__ import annotations

import sys
import textwrap
import types
from typing import Any

from rr_fakes.emulations.mindspeed import Targets, TransformerConfig

STUB = "rr_fakes_stub_moe"
CONFIGS = "rr_fakes.emulations.mindspeed._config"
STUBS = Targets(
    transformer_config=CONFIGS,
    router=STUB,
    moe_utils=STUB,
    moe_layer=STUB,
    tensor_parallel=STUB,
    legacy_dispatcher=f"{STUB}.legacy_a2a_token_dispatcher",
)
STUB_SOURCE = textwrap.dedent(
    """
    import types
    import torch

    SELECTED = []

    def group_limited_topk(scores, topk, num_tokens, num_experts, num_groups, group_topk):
        return torch.topk(scores, k=topk, dim=1)

    def topk_softmax_with_capacity(logits, topk, score_function="softmax", **kwargs):
        SELECTED.append("router module's top-k")
        ids = torch.topk(logits, k=topk, dim=1).indices
        routing_map = torch.zeros_like(logits).bool().scatter(1, ids, True)
        return logits.softmax(-1) * routing_map, routing_map, routing_map.sum(0)

    def gather_from_sequence_parallel_region(tensor):
        return tensor

    def _split_along_first_dim(tensor):
        return tensor

    def scale():
        return "scale"

    class TopKRouter:
        topk = 2
        routing_type = "aux_loss"
        config = types.SimpleNamespace(
            num_moe_experts=8,
            moe_expert_capacity_factor=None,
            moe_pad_expert_input_to_capacity=False,
            moe_token_drop_policy="probs",
            moe_router_pre_softmax=False,
            deterministic_mode=False,
        )

        def apply_z_loss(self, logits):
            return logits

        def aux_loss_load_balancing(self, logits):
            probs, routing_map, _ = topk_softmax_with_capacity(logits, self.topk)
            return probs, routing_map

        def routing(self, logits):
            return "original routing"

    class MoELayer:
        pass
    """
)


def stub_module(name: str, source: str = "") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(source, module.__dict__)
    sys.modules[name] = module
    return module


def installed_line_or_none() -> str | None:
    from rr_fakes.emulations.mindspeed import installed_line

    try:
        return installed_line()
    except ValueError:
        return None


def tiny_config(**kwargs: Any) -> Any:
    return TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, **kwargs)
