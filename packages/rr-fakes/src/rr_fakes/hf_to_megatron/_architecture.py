"""The megatron-core ``GPTModel`` that computes what a Hugging Face MoE checkpoint's ``config.json``
does: its architecture as ``TransformerConfig`` fields and ``GPTModel`` arguments.

The architecture, from the HF config (``TransformerConfig`` fields unless said otherwise):

=================================  ==========================================================
HF config                          megatron-core
=================================  ==========================================================
``num_hidden_layers``              ``num_layers``
``hidden_size``                    ``hidden_size``
``num_attention_heads``            ``num_attention_heads``
``num_key_value_heads``            ``num_query_groups`` (GQA)
``head_dim``                       ``kv_channels`` (softmax scale ``1/sqrt(head_dim)``)
``rms_norm_eps``                   ``normalization="RMSNorm"``, ``layernorm_epsilon``
``rope_parameters.rope_theta``     ``GPTModel(rotary_base=...)``, ``position_embedding_type=
                                   "rope"`` (non-interleaved halves, as HF's ``rotate_half``)
q_norm / k_norm (Qwen3)            ``qk_layernorm=True`` (RMSNorm over ``head_dim``, before RoPE)
q/k/v bias (Qwen2-MoE)             ``add_qkv_bias=True``
``intermediate_size``              ``ffn_hidden_size`` (the dense layers' MLP)
``moe_intermediate_size``          ``moe_ffn_hidden_size`` (Mixtral: ``intermediate_size``)
``mlp_only_layers`` /              ``moe_layer_freq`` as a list (0 = dense), e.g. ``[0,1,1,1]``
``decoder_sparse_step``
``num_experts`` /                  ``num_moe_experts``
``num_local_experts``
``num_experts_per_tok``            ``moe_router_topk``
``norm_topk_prob=True``, Mixtral   ``moe_router_score_function="softmax"``,
                                   ``moe_router_pre_softmax=False``: softmax over the top-k
                                   logits, which is softmax, top-k, renormalise
``norm_topk_prob=False``           ``moe_router_pre_softmax=True``: softmax over all experts,
                                   then top-k (no renormalisation)
``shared_expert_intermediate_      ``moe_shared_expert_intermediate_size``,
size`` (Qwen2-MoE)                 ``moe_shared_expert_gate=True`` (sigmoid gate)
GLM-4-MoE: sigmoid scores,         ``moe_router_score_function="sigmoid"``,
``e_score_correction_bias``        ``moe_router_enable_expert_bias=True`` (``router.expert_bias``),
``n_group`` / ``topk_group``       ``moe_router_num_groups`` / ``moe_router_group_topk``,
``routed_scaling_factor``          ``moe_router_topk_scaling_factor`` (renormalised: k > 1),
``n_shared_experts``               ``moe_shared_expert_intermediate_size`` (no gate),
``partial_rotary_factor``          ``GPTModel(rotary_percent=...)``, ``first_k_dense_replace``
                                   as ``moe_layer_freq``, ``attention_bias`` / ``use_qk_norm``
hidden act ``silu``, gated MLP     ``gated_linear_unit=True``, ``activation_func=F.silu``
``tie_word_embeddings``            ``GPTModel(share_embeddings_and_output_weights=...)``
=================================  ==========================================================

No linear biases (``add_bias_linear=False``), no dropout, every fusion off, experts as the harness
builds them (``SequentialMLP`` of local ``MLP`` experts, ``moe_grouped_gemm=False``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rr_fakes.shims.megatron._gpt import TinyGPTConfig

#: The HF families the loader maps.
HF_LOADER_FAMILIES: tuple[str, ...] = (
    "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "deepseek_v3"
)  # fmt: skip
#: The families whose router is DeepSeek-V3's (sigmoid, selection bias, grouped top-k).
GROUPED_SIGMOID_FAMILIES = ("glm4_moe", "deepseek_v3")


class UnsupportedCheckpointError(ValueError):
    """A checkpoint whose family or settings the loader does not map."""


@dataclass(frozen=True)
class HFGPTSpec:
    """What the loader read from the HF config: the tiny GPT sizes, the extra
    ``TransformerConfig`` fields and the ``GPTModel`` arguments."""

    family: str
    gpt: TinyGPTConfig
    rotary_base: float
    tie_embeddings: bool
    moe_layer_numbers: tuple[int, ...]
    rotary_percent: float = 1.0

    @property
    def num_experts(self) -> int:
        return self.gpt.num_experts

    @property
    def top_k(self) -> int:
        return self.gpt.top_k


def _get(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedCheckpointError(f"RoPE type {rope_type!r} is not mapped")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise UnsupportedCheckpointError("the config has no rope_theta")
    return float(theta)


def _moe_layer_freq(config: Mapping[str, Any], family: str) -> list[int]:
    n = int(config["num_hidden_layers"])
    if family == "mixtral":
        return [1] * n
    if family in GROUPED_SIGMOID_FAMILIES:
        return [0 if i < int(config.get("first_k_dense_replace") or 0) else 1 for i in range(n)]
    only = set(config.get("mlp_only_layers") or ())
    step = int(config.get("decoder_sparse_step", 1) or 1)
    return [0 if (i in only or (i + 1) % step != 0) else 1 for i in range(n)]


def hf_gpt_spec(config: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None) -> HFGPTSpec:
    """The GPTModel that computes what the HF ``config`` (``config.json``'s dict) does;
    ``extra`` adds or overrides ``TransformerConfig`` fields (rr's replay fields, recompute)."""
    family = str(config.get("model_type"))
    if family not in HF_LOADER_FAMILIES:
        raise UnsupportedCheckpointError(
            f"no Megatron mapping for {family!r}; mapped: {', '.join(HF_LOADER_FAMILIES)}"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpointError(f"activation {config.get('hidden_act')!r} is not mapped")
    if config.get("use_sliding_window") or (
        family == "mixtral" and config.get("sliding_window") is not None
    ):
        raise UnsupportedCheckpointError("sliding-window attention is not mapped")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(_get(config, "head_dim", default=hidden // heads))
    num_experts = int(_get(config, "num_experts", "num_local_experts", "n_routed_experts"))
    freq = _moe_layer_freq(config, family)
    fields: dict[str, Any] = {
        "num_query_groups": int(_get(config, "num_key_value_heads", default=heads)),
        "kv_channels": head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(config["rms_norm_eps"]),
        "qk_layernorm": family in ("qwen3_moe", "olmoe") or bool(config.get("use_qk_norm")),
        "add_qkv_bias": bool(family == "qwen2_moe" and config.get("qkv_bias", True))
        or bool(family == "glm4_moe" and config.get("attention_bias")),
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "moe_ffn_hidden_size": int(  # Mixtral and OLMoE size experts by intermediate_size
            config.get("moe_intermediate_size") or config["intermediate_size"]
        ),
        "moe_router_pre_softmax": family != "mixtral" and not config.get("norm_topk_prob", False),
    }
    shared = int(config.get("shared_expert_intermediate_size") or 0) if family == "qwen2_moe" else 0
    if shared:
        fields["moe_shared_expert_intermediate_size"] = shared
        fields["moe_shared_expert_gate"] = True
    if family in GROUPED_SIGMOID_FAMILIES:
        fields.update(_grouped_sigmoid_router(config))
    if family == "deepseek_v3":
        fields.update(_multi_latent_attention(config))
    fields.update(extra or {})
    gpt = TinyGPTConfig(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_experts=num_experts,
        top_k=int(config["num_experts_per_tok"]),
        moe_layer_freq=freq,
        score_function="sigmoid" if family in GROUPED_SIGMOID_FAMILIES else "softmax",
        vocab_size=int(config["vocab_size"]),
        max_sequence_length=int(config.get("max_position_embeddings", 4096)),
        extra=fields,
    )
    return HFGPTSpec(
        family=family,
        gpt=gpt,
        rotary_base=_rope_theta(config),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        moe_layer_numbers=tuple(i + 1 for i, moe in enumerate(freq) if moe),
        rotary_percent=_rotary_percent(config),
    )


def _grouped_sigmoid_router(config: Mapping[str, Any]) -> dict[str, Any]:
    """GLM-4-MoE's router (DeepSeek-V3's without MLA): sigmoid scores, a selection bias, the
    top ``topk_group`` of ``n_group`` groups, the chosen scores renormalised and scaled, and
    ``n_shared_experts`` shared experts without a gate."""
    k, groups, kept = (int(config[n]) for n in ("num_experts_per_tok", "n_group", "topk_group"))
    if not config.get("norm_topk_prob", True):
        raise UnsupportedCheckpointError(
            "norm_topk_prob=False: Megatron renormalises sigmoid top-k scores whenever k > 1"
        )
    if groups > 1 and k != 2 * kept:
        # Megatron scores a group by its top (topk / group_topk) experts, HF and vLLM by
        # their top 2: the same groups only when topk = 2 * topk_group (DeepSeek-V3: 8, 4)
        raise UnsupportedCheckpointError(
            f"grouped top-k with num_experts_per_tok={k}, topk_group={kept}: Megatron scores "
            f"each group by its top {k // kept} experts where HF and vLLM take the top 2; they "
            "pick the same groups only when num_experts_per_tok = 2 * topk_group"
        )
    fields: dict[str, Any] = {
        "moe_router_enable_expert_bias": True,
        "moe_router_topk_scaling_factor": float(config.get("routed_scaling_factor") or 1.0),
        "moe_shared_expert_intermediate_size": int(config["moe_intermediate_size"])
        * int(config.get("n_shared_experts") or 0),
    }
    if groups > 1:
        fields.update(moe_router_num_groups=groups, moe_router_group_topk=kept)
    if not fields["moe_shared_expert_intermediate_size"]:
        del fields["moe_shared_expert_intermediate_size"]
    return fields


def _multi_latent_attention(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's attention: queries through a ``q_lora_rank`` latent, keys and values
    through a ``kv_lora_rank`` one (each RMSNorm'd), a shared ``qk_rope_head_dim`` RoPE key,
    RoPE on interleaved pairs, softmax scale ``1 / sqrt(qk_nope + qk_rope)``."""
    if not config.get("rope_interleave", True):
        raise UnsupportedCheckpointError("MLA with rope_interleave=False is not mapped")
    return {
        "multi_latent_attention": True,
        "q_lora_rank": int(config["q_lora_rank"]),
        "kv_lora_rank": int(config["kv_lora_rank"]),
        "qk_head_dim": int(config["qk_nope_head_dim"]),
        "qk_pos_emb_head_dim": int(config["qk_rope_head_dim"]),
        "v_head_dim": int(config["v_head_dim"]),
        "qk_layernorm": True,  # the two latents' norms
        "rope_type": "rope",
        "rotary_base": _rope_theta(config),
        "rotary_scaling_factor": 1.0,  # no YaRN: the softmax scale keeps mscale 1
    }


def _rotary_percent(config: Mapping[str, Any]) -> float:
    """The share of each head's dims RoPE turns (GLM-4-MoE: ``partial_rotary_factor``; in
    ``rope_parameters`` from transformers 5)."""
    params = config.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """A checkpoint folder's ``config.json`` (the text config of a multimodal one)."""
    config: dict[str, Any] = json.loads((Path(path) / "config.json").read_text())
    return dict(config.get("text_config") or config)
