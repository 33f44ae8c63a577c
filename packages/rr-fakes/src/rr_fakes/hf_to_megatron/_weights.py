"""A Hugging Face MoE checkpoint's tensors under megatron-core ``GPTModel`` parameter names, and
their copy into a model built by :func:`rr_fakes.hf_to_megatron.build_gpt_for`.

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rr_fakes.hf_to_megatron._architecture import (
    GROUPED_SIGMOID_FAMILIES,
    HFGPTSpec,
    UnsupportedCheckpointError,
)


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
                if spec.family in GROUPED_SIGMOID_FAMILIES
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
