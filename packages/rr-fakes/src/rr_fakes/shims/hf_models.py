"""Tiny random-initialised transformers MoE models, built from config objects (no downloads).

Each family's config is shrunk to a few layers of width 32 with 8 experts and top-2 (grouped
families: 4 groups, 2 kept), a dense first layer where the family has one, and eager attention
so that every path runs on the CPU. ``tiny_model`` seeds torch, builds the model and draws every
router weight at a scale that spreads the routing (transformers initialises some to zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

NUM_EXPERTS, TOP_K, HIDDEN, VOCAB = 8, 2, 32, 96

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 48,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 256, "num_experts_per_tok": TOP_K,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip

_QWEN_NEXT: dict[str, Any] = {
    "num_experts": NUM_EXPERTS, "moe_intermediate_size": 16, "norm_topk_prob": True,
    "shared_expert_intermediate_size": 16,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "linear_num_value_heads": 2, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 2,
}  # fmt: skip

_GROUPED: dict[str, Any] = {
    "n_routed_experts": NUM_EXPERTS, "moe_intermediate_size": 16, "n_shared_experts": 1,
    "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}  # fmt: skip

#: Per family (the text config's model_type): what it adds to the common sizes.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "num_experts": NUM_EXPERTS, "moe_intermediate_size": 16, "norm_topk_prob": True,
        "mlp_only_layers": [0],
    },
    "qwen3_next": {**_QWEN_NEXT, "mlp_only_layers": [0]},
    "qwen3_5_moe_text": _QWEN_NEXT,
    "qwen2_moe": {
        "num_experts": NUM_EXPERTS, "moe_intermediate_size": 16, "norm_topk_prob": False,
        "shared_expert_intermediate_size": 16, "mlp_only_layers": [0],
    },
    "olmoe": {"num_experts": NUM_EXPERTS, "norm_topk_prob": False},
    "mixtral": {"num_local_experts": NUM_EXPERTS},
    "gpt_oss": {
        "num_local_experts": NUM_EXPERTS, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    "deepseek_v3": {
        **_GROUPED, "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 16,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "rope_interleave": True,
    },
    "glm4_moe": {**_GROUPED, "partial_rotary_factor": 0.5},
}  # fmt: skip


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A tiny config of ``model_type`` (a key of :data:`FAMILY_CONFIGS`, or any other model
    type transformers knows, with ``overrides`` alone)."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"transformers {_version()} has no model_type {model_type!r}")
    kwargs = {**_COMMON, **FAMILY_CONFIGS.get(model_type, {}), **overrides}
    config = CONFIG_MAPPING[model_type](**kwargs)
    config._attn_implementation = "eager"
    return config


def routers_of(model: nn.Module) -> list[Any]:
    """Every module whose class name ends in Router (the families' router modules)."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("router")]


def tiny_model(
    model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any
) -> Any:
    """A seeded tiny ``AutoModelForCausalLM`` of ``model_type``, routers spread, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    auto: Any = AutoModelForCausalLM  # untyped where transformers is installed, Any elsewhere
    model = auto.from_config(tiny_config(model_type, **overrides), dtype=dtype)
    with torch.no_grad():
        for router in routers_of(model):
            router.weight.normal_(0.0, 0.5)
            bias = getattr(router, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                bias.uniform_(-0.05, 0.05)
    return model.eval()


def perturb_routers(model: nn.Module, scale: float = 0.3, *, seed: int = 1) -> None:
    """Add noise to every router weight, so native routing differs from a recorded one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in routers_of(model):
            noise = torch.randn(router.weight.shape, generator=generator) * scale
            router.weight.add_(noise.to(router.weight))


class ExpertIds:
    """The expert ids each of ``layers``' experts module receives (a forward pre-hook) while
    :attr:`on`; a layer without an experts module is refused."""

    def __init__(self, model: Any, layers: tuple[int, ...]) -> None:
        self.on = False
        self.seen: dict[int, list[torch.Tensor]] = {n: [] for n in layers}
        self._handles = []
        for index, layer in enumerate(model.get_decoder().layers):
            experts = getattr(getattr(layer, "mlp", None), "experts", None)
            if isinstance(experts, nn.Module) and index + 1 in self.seen:
                hook = self._hook(index + 1)
                self._handles.append(experts.register_forward_pre_hook(hook, with_kwargs=True))
        if len(self._handles) != len(layers):
            self.close()
            raise RuntimeError(
                f"expected an experts module in each MoE layer {layers}, found {len(self._handles)}"
            )

    def _hook(self, layer: int) -> Any:
        def hook(_module: nn.Module, args: Any, kwargs: Any) -> None:
            if self.on:
                ids = kwargs.get("top_k_index", args[1] if len(args) > 1 else None)
                self.seen[layer].append(ids.detach().to(torch.int64).cpu())

        return hook

    def loss_call(
        self, wrapped: Any, args: Any, kwargs: Any
    ) -> tuple[Any, dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
        """TRL's ``_compute_loss(model, inputs)`` (the call a wrapt wrapper gets) run with the
        probe on: its result, what each layer's experts received (:meth:`take`), and the batch's
        token ids and mask ``[B, S]``, prompt then completion."""
        inputs = args[1]
        ids_BS = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask_BS = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        self.on = True
        try:
            result = wrapped(*args, **kwargs)
        finally:
            self.on = False
        return result, self.take(), ids_BS, mask_BS

    def take(self) -> dict[int, torch.Tensor]:
        """Each layer's ids since the last take, concatenated (layers that saw none left out)."""
        out = {n: torch.cat(v) for n, v in self.seen.items() if v}
        for v in self.seen.values():
            v.clear()
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def right_padded(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` ``[B, S]`` (int64) of token sequences, each padded
    on the right with zeros to the longest one."""
    S = max(len(s) for s in sequences)
    ids_BS = torch.zeros(len(sequences), S, dtype=torch.long)
    mask_BS = torch.zeros(len(sequences), S, dtype=torch.long)
    for b, tokens in enumerate(sequences):
        ids_BS[b, : len(tokens)] = torch.tensor(tokens)
        mask_BS[b, : len(tokens)] = 1
    return ids_BS, mask_BS


def _version() -> str:
    import transformers

    return str(transformers.__version__)
