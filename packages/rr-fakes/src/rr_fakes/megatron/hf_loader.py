"""A Hugging Face MoE checkpoint as a real megatron-core ``GPTModel`` on CPU: the model built
with Megatron's local (non Transformer Engine) specs from the checkpoint's ``config.json``, and
the checkpoint's ``model.safetensors`` copied into it. The same weights then run in vLLM, in
transformers and in Megatron, so a rollout's routes can be replayed in Megatron on the model
that produced them.

Families: ``qwen3_moe``, ``qwen2_moe`` (with its gated shared expert), ``mixtral``, ``olmoe``
(its q / k norms over all heads at once: :mod:`rr_fakes.megatron.hf_qk_norm` in the layer spec),
``glm4_moe`` (sigmoid scores with a selection bias, grouped top-k, partial RoPE, shared experts
without a gate; grouped only where ``num_experts_per_tok = 2 * topk_group``, the one case where
Megatron's group scores equal HF's and vLLM's) and ``deepseek_v3`` (that router, with MLA:
``MLATransformerConfig``, and :mod:`rr_fakes.megatron.hf_mla_attention` as its core attention,
which Megatron's local spec lacks).

The architecture read from ``config.json`` (the table of HF config keys and megatron-core fields)
is :mod:`rr_fakes.megatron.hf_architecture`; the weights' names and their copy (HF name ->
Megatron name, every tensor placed exactly once) are :mod:`rr_fakes.megatron.hf_weights`. This
module builds the model from the one and fills it with the other, and keeps their public names
importable from here.

Call :func:`build_hf_gpt` inside :func:`rr_fakes.megatron.model_parallel` (one rank: no tensor,
pipeline or expert parallelism).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from rr_fakes.megatron._flags import megatron_flags
from rr_fakes.megatron._gpt import transformer_config
from rr_fakes.megatron.hf_architecture import (
    HF_LOADER_FAMILIES,
    HFGPTSpec,
    UnsupportedCheckpointError,
    hf_gpt_spec,
    read_hf_config,
)
from rr_fakes.megatron.hf_mla_attention import MLACoreAttention
from rr_fakes.megatron.hf_qk_norm import KeyHeadsRMSNorm, QueryHeadsRMSNorm
from rr_fakes.megatron.hf_weights import load_hf_weights, megatron_state, read_hf_state

__all__ = [
    "HF_LOADER_FAMILIES",
    "HFGPTSpec",
    "UnsupportedCheckpointError",
    "build_gpt_for",
    "build_hf_gpt",
    "hf_gpt_spec",
    "load_hf_weights",
    "megatron_state",
    "read_hf_config",
    "read_hf_state",
]


def build_hf_gpt(
    path: str | Path, *, extra: Mapping[str, Any] | None = None
) -> tuple[nn.Module, HFGPTSpec]:
    """The checkpoint at ``path`` as a float32 GPTModel with its weights loaded (eval mode),
    and the spec it was built from. Call inside :func:`rr_fakes.megatron.model_parallel`."""
    config = read_hf_config(path)
    spec = hf_gpt_spec(config, extra=extra)
    model = build_gpt_for(spec)
    load_hf_weights(model, read_hf_state(path), spec)
    model.eval()
    return model, spec


def build_gpt_for(spec: HFGPTSpec) -> nn.Module:
    """A randomly initialised GPTModel of ``spec`` (local specs, untied output layer unless
    the checkpoint ties it)."""
    specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
    gpt_model = importlib.import_module("megatron.core.models.gpt.gpt_model")
    tc = transformer_config(spec.gpt)
    stage_kw = {"vp_stage": None} if megatron_flags().vp_stage_kwarg else {}
    block_spec = specs.get_gpt_decoder_block_spec(tc, use_transformer_engine=False, **stage_kw)
    if spec.family == "olmoe":  # its q / k norms span all heads at once
        block_spec = _with_attention(
            block_spec, q_layernorm=QueryHeadsRMSNorm, k_layernorm=KeyHeadsRMSNorm
        )
    if spec.gpt.extra.get("multi_latent_attention"):  # keys wider than values
        block_spec = _with_attention(block_spec, core_attention=MLACoreAttention)
    model: nn.Module = gpt_model.GPTModel(
        config=tc,
        transformer_layer_spec=block_spec,
        vocab_size=spec.gpt.vocab_size,
        max_sequence_length=spec.gpt.max_sequence_length,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=spec.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=spec.rotary_base,
        rotary_percent=spec.rotary_percent,
        **stage_kw,
    )
    return model


def _with_attention(block_spec: Any, **modules: Any) -> Any:
    """The block spec with ``modules`` in place of those of every layer's self-attention."""
    layers = []
    for layer in block_spec.layer_specs:
        attention = layer.submodules.self_attention
        parts = dataclasses.replace(attention.submodules, **modules)
        attention = dataclasses.replace(attention, submodules=parts)
        sub = dataclasses.replace(layer.submodules, self_attention=attention)
        layers.append(dataclasses.replace(layer, submodules=sub))
    return dataclasses.replace(block_spec, layer_specs=layers)
