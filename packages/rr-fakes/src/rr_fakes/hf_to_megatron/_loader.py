"""The model from the architecture and filled with the weights: :func:`build_gpt_for` builds
a randomly initialised ``GPTModel`` with Megatron's local (non Transformer Engine) specs from an
:class:`~rr_fakes.hf_to_megatron.HFGPTSpec` (:mod:`._architecture`), :func:`build_hf_gpt` also
copies the checkpoint's weights into it (:mod:`._weights`). OLMoE's q / k norms over all heads
at once (:mod:`._qk_norm`) and MLA's core attention (:mod:`._mla_attention`) go into the layer
spec where the family needs them."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from rr_fakes.hf_to_megatron._architecture import HFGPTSpec, hf_gpt_spec, read_hf_config
from rr_fakes.hf_to_megatron._mla_attention import MLACoreAttention
from rr_fakes.hf_to_megatron._qk_norm import KeyHeadsRMSNorm, QueryHeadsRMSNorm
from rr_fakes.hf_to_megatron._weights import load_hf_weights, read_hf_state
from rr_fakes.shims.megatron._flags import megatron_flags
from rr_fakes.shims.megatron._gpt import transformer_config


def build_hf_gpt(
    path: str | Path, *, extra: Mapping[str, Any] | None = None
) -> tuple[nn.Module, HFGPTSpec]:
    """The checkpoint at ``path`` as a float32 GPTModel with its weights loaded (eval mode),
    and the spec it was built from. Call inside :func:`rr_fakes.shims.megatron.model_parallel`."""
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
