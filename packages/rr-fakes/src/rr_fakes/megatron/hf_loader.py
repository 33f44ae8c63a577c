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

The weights (HF name -> Megatron name; ``L`` = HF layer index, ``L + 1`` = Megatron's
``layer_number``, ``decoder.layers.L`` in the module tree):

- ``model.embed_tokens.weight`` -> ``embedding.word_embeddings.weight``
- ``model.layers.L.input_layernorm.weight`` -> ``decoder.layers.L.input_layernorm.weight``
- ``self_attn.{q,k,v}_proj.weight`` -> ``self_attention.linear_qkv.weight``, fused per query
  group as ``Attention.get_query_key_value_tensors`` splits it: the output rows are
  ``num_query_groups`` blocks, each ``[q heads of the group (heads / groups * head_dim);
  k (head_dim); v (head_dim)]``; biases the same way into ``linear_qkv.bias``
- ``self_attn.q_norm.weight`` / ``k_norm.weight`` -> ``self_attention.q_layernorm.weight`` /
  ``k_layernorm.weight``
- ``self_attn.o_proj.weight`` -> ``self_attention.linear_proj.weight``
- ``post_attention_layernorm.weight`` -> ``pre_mlp_layernorm.weight``
- dense MLP ``mlp.{gate,up,down}_proj`` -> ``mlp.linear_fc1.weight = [gate; up]`` (rows; the
  gated linear unit chunks fc1's output in two and applies the activation to the first half),
  ``mlp.linear_fc2.weight = down``
- router ``mlp.gate.weight`` (Mixtral ``block_sparse_moe.gate``) -> ``mlp.router.weight``
  ``[E, hidden]``
- expert ``e``: ``experts.e.{gate,up,down}_proj`` (Mixtral ``w1, w3, w2``; or the fused
  ``experts.gate_up_proj[e]`` ``[2 * ffn, hidden]`` already ``[gate; up]`` and
  ``experts.down_proj[e]``) -> ``mlp.experts.local_experts.e.linear_fc1 = [gate; up]``,
  ``linear_fc2 = down``
- Qwen2-MoE ``mlp.shared_expert.*`` -> ``mlp.shared_experts.linear_fc1 = [gate; up]``,
  ``linear_fc2``; ``mlp.shared_expert_gate.weight`` ``[1, hidden]`` ->
  ``mlp.shared_experts.gate_weight``
- ``model.norm.weight`` -> ``decoder.final_layernorm.weight``
- ``lm_head.weight`` -> ``output_layer.weight``

Every Megatron parameter must be written exactly once and every checkpoint tensor read
exactly once, or :func:`load_hf_weights` raises: a silently unloaded parameter would leave its
random initialisation in the model.

Call :func:`build_hf_gpt` inside :func:`rr_fakes.megatron.model_parallel` (one rank: no tensor,
pipeline or expert parallelism).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rr_fakes.megatron._flags import megatron_flags
from rr_fakes.megatron._gpt import TinyGPTConfig, transformer_config
from rr_fakes.megatron.hf_mla_attention import MLACoreAttention
from rr_fakes.megatron.hf_qk_norm import KeyHeadsRMSNorm, QueryHeadsRMSNorm

#: The HF families the loader maps.
HF_LOADER_FAMILIES: tuple[str, ...] = (
    "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "deepseek_v3"
)  # fmt: skip
#: The families whose router is DeepSeek-V3's (sigmoid, selection bias, grouped top-k).
_GROUPED_SIGMOID = ("glm4_moe", "deepseek_v3")


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
    if family in _GROUPED_SIGMOID:
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
    if family in _GROUPED_SIGMOID:
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
        score_function="sigmoid" if family in _GROUPED_SIGMOID else "softmax",
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


def read_hf_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


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


def _fused_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, head_dim: int
) -> torch.Tensor:
    """HF's q / k / v rows (weights ``[out, in]`` or biases ``[out]``) in Megatron's
    ``linear_qkv`` order: per query group its q heads, then its k head, then its v head."""
    tail = q.shape[1:]
    q_g = q.reshape(groups, -1, *tail)  # [ng, np/ng * hn, ...]
    k_g = k.reshape(groups, head_dim, *tail)
    v_g = v.reshape(groups, head_dim, *tail)
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(-1, *tail)


def _expert_weights(
    state: Mapping[str, torch.Tensor], prefix: str, num_experts: int, family: str
) -> tuple[list[str], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per expert ``(fc1 = [gate; up], fc2 = down)``, from per-expert tensors or the fused
    ``gate_up_proj`` / ``down_proj`` layout; and the names read."""
    fused = f"{prefix}.experts.gate_up_proj"
    if fused in state:
        down = f"{prefix}.experts.down_proj"
        return [fused, down], [(state[fused][e], state[down][e]) for e in range(num_experts)]
    gate, up, down = (
        ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    )
    names, out = [], []
    for e in range(num_experts):
        g, u, d = (f"{prefix}.experts.{e}.{p}.weight" for p in (gate, up, down))
        names += [g, u, d]
        out.append((torch.cat([state[g], state[u]], dim=0), state[d]))
    return names, out


Take = Callable[[str], torch.Tensor]


def _qkv_weights(
    take: Take, att: str, mc: str, fields: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Standard attention: q / k / v fused per query group, their biases, the q / k norms."""
    groups, head_dim = int(fields["num_query_groups"]), int(fields["kv_channels"])
    out: dict[str, torch.Tensor] = {}
    for kind in ("weight", "bias") if fields.get("add_qkv_bias") else ("weight",):
        q, k, v = (take(f"{att}.{p}_proj.{kind}") for p in "qkv")
        out[f"{mc}.linear_qkv.{kind}"] = _fused_qkv(q, k, v, groups, head_dim)
    if fields.get("qk_layernorm"):
        out[f"{mc}.q_layernorm.weight"] = take(f"{att}.q_norm.weight")
        out[f"{mc}.k_layernorm.weight"] = take(f"{att}.k_norm.weight")
    return out


def _mla_weights(take: Take, att: str, mc: str) -> dict[str, torch.Tensor]:
    """DeepSeek-V3's attention: the same splits on both sides (q heads ``[nope; rope]``, the
    kv latent ``[kv_lora; rope]``, kv heads ``[nope; v]``), only the names differ."""
    return {
        f"{mc}.linear_q_down_proj.weight": take(f"{att}.q_a_proj.weight"),
        f"{mc}.q_layernorm.weight": take(f"{att}.q_a_layernorm.weight"),
        f"{mc}.linear_q_up_proj.weight": take(f"{att}.q_b_proj.weight"),
        f"{mc}.linear_kv_down_proj.weight": take(f"{att}.kv_a_proj_with_mqa.weight"),
        f"{mc}.kv_layernorm.weight": take(f"{att}.kv_a_layernorm.weight"),
        f"{mc}.linear_kv_up_proj.weight": take(f"{att}.kv_b_proj.weight"),
    }


def megatron_state(state: Mapping[str, torch.Tensor], spec: HFGPTSpec) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the GPTModel's parameter names (the module docstring's
    mapping). Raises if a checkpoint tensor is left unread."""
    tc = spec.gpt
    fields = tc.extra
    out: dict[str, torch.Tensor] = {}
    read: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise UnsupportedCheckpointError(f"the checkpoint has no {name}")
        read.add(name)
        return state[name]

    out["embedding.word_embeddings.weight"] = take("model.embed_tokens.weight")
    moe_prefix = "block_sparse_moe" if spec.family == "mixtral" else "mlp"
    for i in range(tc.num_layers):
        hf, mc = f"model.layers.{i}", f"decoder.layers.{i}"
        att = f"{hf}.self_attn"
        out[f"{mc}.input_layernorm.weight"] = take(f"{hf}.input_layernorm.weight")
        if fields.get("multi_latent_attention"):
            out.update(_mla_weights(take, att, f"{mc}.self_attention"))
        else:
            out.update(_qkv_weights(take, att, f"{mc}.self_attention", fields))
        out[f"{mc}.self_attention.linear_proj.weight"] = take(f"{att}.o_proj.weight")
        out[f"{mc}.pre_mlp_layernorm.weight"] = take(f"{hf}.post_attention_layernorm.weight")
        if (i + 1) not in spec.moe_layer_numbers:
            mlp = f"{hf}.mlp"
            out[f"{mc}.mlp.linear_fc1.weight"] = torch.cat(
                [take(f"{mlp}.gate_proj.weight"), take(f"{mlp}.up_proj.weight")], dim=0
            )
            out[f"{mc}.mlp.linear_fc2.weight"] = take(f"{mlp}.down_proj.weight")
            continue
        moe = f"{hf}.{moe_prefix}"
        out[f"{mc}.mlp.router.weight"] = take(f"{moe}.gate.weight")
        if fields.get("moe_router_enable_expert_bias"):  # a buffer: the selection bias
            out[f"{mc}.mlp.router.expert_bias"] = take(f"{moe}.gate.e_score_correction_bias")
        names, experts = _expert_weights(state, moe, tc.num_experts, spec.family)
        for name in names:
            take(name)
        for e, (fc1, fc2) in enumerate(experts):
            out[f"{mc}.mlp.experts.local_experts.{e}.linear_fc1.weight"] = fc1
            out[f"{mc}.mlp.experts.local_experts.{e}.linear_fc2.weight"] = fc2
        if fields.get("moe_shared_expert_intermediate_size"):
            se = (
                f"{moe}.shared_experts"
                if spec.family in _GROUPED_SIGMOID
                else f"{moe}.shared_expert"
            )
            out[f"{mc}.mlp.shared_experts.linear_fc1.weight"] = torch.cat(
                [take(f"{se}.gate_proj.weight"), take(f"{se}.up_proj.weight")], dim=0
            )
            out[f"{mc}.mlp.shared_experts.linear_fc2.weight"] = take(f"{se}.down_proj.weight")
            if fields.get("moe_shared_expert_gate"):
                gate = f"{moe}.shared_expert_gate.weight"
                out[f"{mc}.mlp.shared_experts.gate_weight"] = take(gate)
    out["decoder.final_layernorm.weight"] = take("model.norm.weight")
    if not spec.tie_embeddings:
        out["output_layer.weight"] = take("lm_head.weight")
    unread = sorted(set(state) - read - ({"lm_head.weight"} if spec.tie_embeddings else set()))
    if unread:
        raise UnsupportedCheckpointError(f"checkpoint tensors the mapping does not place: {unread}")
    return out


def load_hf_weights(model: nn.Module, state: Mapping[str, torch.Tensor], spec: HFGPTSpec) -> None:
    """Copy the HF ``state`` into ``model`` (built from ``spec``). Raises unless every
    parameter of the model gets exactly its checkpoint tensor, shapes equal."""
    mapped = megatron_state(state, spec)
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    params |= {name: b for name, b in model.named_buffers() if name in mapped}  # expert bias
    missing = sorted(set(params) - set(mapped))
    extra = sorted(set(mapped) - set(params))
    if missing or extra:
        raise UnsupportedCheckpointError(
            f"the mapping and the GPTModel disagree: unloaded {missing}, unknown {extra}"
        )
    with torch.no_grad():
        for name, param in params.items():
            value = mapped[name]
            if tuple(value.shape) != tuple(param.shape):
                raise UnsupportedCheckpointError(
                    f"{name}: checkpoint shape {tuple(value.shape)}, model {tuple(param.shape)}"
                )
            param.copy_(value.to(param.dtype))
