"""rr_fakes.hf_to_megatron: a tiny HF MoE checkpoint loaded into a real GPTModel computes
what transformers computes on the same checkpoint: logits equal in float32 and every router
picks the same experts for every token (padded batch of several sequences)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the checkpoints are built and read by transformers")

from rr_fakes.hf_to_megatron import (
    HF_LOADER_FAMILIES,
    UnsupportedCheckpointError,
    build_hf_gpt,
    hf_gpt_spec,
    megatron_state,
    read_hf_config,
    read_hf_state,
)
from rr_fakes.shims.hf_checkpoints import build_checkpoint
from rr_fakes.shims.hf_models import routers_of
from rr_fakes.shims.megatron import map_ids, model_parallel, route_log

B, S = 3, 40


def _hf_forward(model: Any, ids_BS: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    picks: dict[int, torch.Tensor] = {}
    handles, wrapped = [], []
    for number, layer in enumerate(model.model.layers, start=1):
        moe = getattr(layer.mlp, "route_tokens_to_experts", None)
        if moe is not None:  # DeepSeek-style: the MoE block routes, its gate returns logits

            def route(logits: torch.Tensor, number: int = number, inner: Any = moe) -> Any:
                ids, weights = inner(logits)
                picks[number] = ids.sort(-1).values
                return ids, weights

            layer.mlp.route_tokens_to_experts = route
            wrapped.append(layer.mlp)
            continue
        for router in routers_of(layer):

            def hook(_m: Any, _a: Any, out: Any, number: int = number) -> None:
                picks[number] = out[2].sort(-1).values  # (logits, weights, indices)

            handles.append(router.register_forward_hook(hook))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids_BS).logits
    finally:
        for handle in handles:
            handle.remove()
        for block in wrapped:
            del block.route_tokens_to_experts
    return logits, picks


@pytest.mark.parametrize("family", HF_LOADER_FAMILIES)
def test_the_gpt_model_computes_what_transformers_computes(family: str) -> None:
    ck = build_checkpoint(family)
    ids_BS = torch.randint(3, ck.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    hf_logits, hf_picks = _hf_forward(ck.load_model(torch.float32), ids_BS)
    with model_parallel():
        model, spec = build_hf_gpt(ck.path)
        assert spec.moe_layer_numbers == ck.moe_layer_numbers
        with torch.no_grad(), route_log(model) as log:
            logits = model(ids_BS, torch.arange(S).expand(B, S), attention_mask=None)
    assert logits.shape == hf_logits.shape == (B, S, ck.vocab_size)
    torch.testing.assert_close(logits, hf_logits, rtol=0, atol=1e-4)
    assert sorted(log.forward) == sorted(hf_picks) == list(ck.moe_layer_numbers)
    for layer, maps in log.forward.items():  # the router sees rows in [S, B] order
        ids_NK = map_ids(maps[-1]).view(S, B, -1).transpose(0, 1).reshape(B * S, -1)
        assert torch.equal(ids_NK, hf_picks[layer]), f"layer {layer} routes differently"


def test_every_checkpoint_tensor_is_placed_and_the_qkv_is_fused_per_query_group() -> None:
    ck = build_checkpoint("qwen3_moe")
    state = read_hf_state(ck.path)
    spec = hf_gpt_spec(read_hf_config(ck.path))
    mapped = megatron_state(state, spec)
    qkv = mapped["decoder.layers.1.self_attention.linear_qkv.weight"]
    q, k, v = (state[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))  # one query group: [q heads; k; v]
    fc1 = mapped["decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight"]
    gate, up = (state[f"model.layers.2.mlp.experts.3.{p}_proj.weight"] for p in ("gate", "up"))
    assert torch.equal(fc1, torch.cat([gate, up]))
    with pytest.raises(UnsupportedCheckpointError, match="does not place"):
        megatron_state({**state, "model.layers.0.stray.weight": torch.zeros(1)}, spec)


def test_a_family_without_a_mapping_is_refused() -> None:
    config = {**read_hf_config(build_checkpoint("qwen3_moe").path), "model_type": "gpt_oss"}
    with pytest.raises(UnsupportedCheckpointError, match="no Megatron mapping"):
        hf_gpt_spec(config)


def test_grouped_top_k_megatron_scores_differently_is_refused() -> None:
    """The tiny GLM-4-MoE at top-2 of 4 groups (2 kept): Megatron would score each group by its
    top expert, HF and vLLM by their top 2, and pick other experts."""
    ck = build_checkpoint("glm4_moe", num_experts_per_tok=2)
    with pytest.raises(UnsupportedCheckpointError, match="top 2"):
        hf_gpt_spec(read_hf_config(ck.path))
