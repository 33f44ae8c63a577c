"""A Hugging Face checkpoint directory converted into a megatron-core ``GPTModel`` by
Megatron-Bridge's own conversion, on CPU: ``AutoBridge.from_hf_pretrained``,
``to_megatron_provider(load_weights=True)`` (bridge's mapping registry copies the checkpoint's
tensors in through its pre-wrap hook), ``apply_overrides_and_finalize`` and
``provide_distributed_model(wrap_with_ddp=False)``.

Bridge builds its layers with Transformer Engine where it can; without TE two of its families'
layers need a CPU stand-in, swapped into the layer spec it chose (nothing of its mapping):

- grouped experts: the OLMoE and GLM-4.5 mapping registries map only grouped expert weights
  (``experts.linear_fc1.weight<e>``, TE's ``GroupedLinear``), and Megatron's local spec builds
  ``SequentialMLP`` (``local_experts.<e>``), so the experts become Megatron's ``TEGroupedMLP``
  over :class:`CPUGroupedLinear` (the ``GroupedLinearFc1/Fc2Interface`` Megatron defines);
- MLA's core attention: Megatron's local ``DotProductAttention`` refuses the key / value widths
  (as in :mod:`rr_fakes.hf_to_megatron`), :class:`~rr_fakes.hf_to_megatron._mla_attention.
  MLACoreAttention` takes them.

:data:`BRIDGE_FAMILIES` says, per family of :mod:`rr_fakes.shims.hf_checkpoints` that bridge 0.6.2
converts, what it takes for bridge's model to compute the checkpoint's (each entry says why);
:data:`BRIDGE_UNSUPPORTED` the families it has no converter for.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rr_fakes.hf_to_megatron._mla_attention import MLACoreAttention
from rr_fakes.shims.megatron.bridge_shims import CPU_OVERRIDES


@dataclass(frozen=True)
class BridgeFamily:
    """What bridge's conversion of one family's tiny checkpoint takes."""

    #: config fields of the checkpoint bridge is given (``build_checkpoint`` overrides), where
    #: the family's default tiny checkpoint is shaped in a way bridge's converter is not
    checkpoint: Mapping[str, Any] = field(default_factory=dict)
    #: config fields bridge reads differently from the checkpoint (``from_hf_pretrained``'s)
    hf_config: Mapping[str, Any] = field(default_factory=dict)
    #: the provider's ``rotary_percent`` from the config's ``rope_parameters``
    partial_rotary: bool = False


#: The checkpoints hold no multi-token-prediction layers (transformers saves none), which the
#: providers build from ``num_nextn_predict_layers`` (default 1) and leave unloaded (a warning
#: per tensor); DeepSeek-V3's forward then raises "Trying to use a TE block when it's not
#: present." (its MTP loss).
_NO_MTP = {"num_nextn_predict_layers": 0}

BRIDGE_FAMILIES: Mapping[str, BridgeFamily] = {
    # The provider sets decoder_sparse_step = 1 and ignores mlp_only_layers: on the dense-first
    # checkpoint layer 1 is built as MoE with no weights loaded (a warning per tensor, NaN
    # logits). Qwen3-MoE releases have no dense layers, nor has the checkpoint it is given.
    "qwen3_moe": BridgeFamily(checkpoint={"mlp_only_layers": []}),
    # The OLMoE attention's k norm spans num_attention_heads * head_dim: with grouped query
    # attention bridge raises "Shape mismatch for megatron param decoder.layers.0.
    # self_attention.k_layernorm.weight: Expected shape: torch.Size([64]) Got shape:
    # torch.Size([32])". OLMoE releases have as many key / value heads as query heads.
    "olmoe": BridgeFamily(checkpoint={"num_key_value_heads": 2}),
    # Bridge reads partial_rotary_factor from the config's top level, where transformers 5
    # keeps it in rope_parameters: without the override the rotary spans all of head_dim.
    "glm4_moe": BridgeFamily(hf_config=_NO_MTP, partial_rotary=True),
    "deepseek_v3": BridgeFamily(hf_config=_NO_MTP),
}

#: Families of rr_fakes.shims.hf_checkpoints bridge 0.6.2 has no converter for (their architectures
#: are not in ``AutoBridge.list_supported_models()``).
BRIDGE_UNSUPPORTED: tuple[str, ...] = ("qwen2_moe", "mixtral")


class CPUGroupedLinear(nn.Module):
    """One ``[out, in]`` weight per expert, named ``weight<e>`` as TE's ``GroupedLinear``
    names them; rows of the input arrive grouped by expert, ``m_splits`` rows each."""

    partition_dim = 0  # bridge's fallback reads these to pick its tensor-parallel mapping
    tensor_model_parallel = True

    def __init__(
        self,
        num_gemms: int,
        input_size: int,
        output_size: int,
        /,
        *,
        config: Any,
        init_method: Callable[[torch.Tensor], None],
        bias: bool,
        skip_bias_add: bool,
        is_expert: bool,
        tp_comm_buffer_name: str | None = None,
        pg_collection: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if bias:
            raise NotImplementedError("CPUGroupedLinear builds experts without biases")
        self.config = config
        self.num_gemms = num_gemms
        for e in range(num_gemms):
            weight = torch.empty(output_size, input_size, dtype=config.params_dtype)
            init_method(weight)
            self.register_parameter(f"weight{e}", nn.Parameter(weight))

    def forward(self, x: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, None]:
        parts = torch.split(x, m_splits)
        outs = [p @ getattr(self, f"weight{e}").t() for e, p in enumerate(parts)]
        return torch.cat(outs), None

    def backward_dw(self) -> None:
        pass


class CPURowGroupedLinear(CPUGroupedLinear):
    """fc2: split along its input dimension under tensor parallelism."""

    partition_dim = 1


def _grouped_experts() -> Any:
    experts = importlib.import_module("megatron.core.transformer.moe.experts")
    return functools.partial(
        experts.TEGroupedMLP,
        submodules=experts.GroupedMLPSubmodules(
            linear_fc1=CPUGroupedLinear, linear_fc2=CPURowGroupedLinear
        ),
    )


def _submodules(builder: Any) -> Any:
    """A builder's submodules: a ``ModuleSpec``'s, or a ``partial``'s keyword (0.19)."""
    if isinstance(builder, functools.partial):
        return builder.keywords.get("submodules")
    return getattr(builder, "submodules", None)


def _with_submodules(builder: Any, **changes: Any) -> Any:
    parts = dataclasses.replace(_submodules(builder), **changes)
    if isinstance(builder, functools.partial):
        keywords = {**builder.keywords, "submodules": parts}
        return functools.partial(builder.func, *builder.args, **keywords)
    return dataclasses.replace(builder, submodules=parts)


def _cpu_layer(layer: Any) -> Any:
    """One layer spec with the CPU stand-ins in place (see the module docstring)."""
    sub = layer.submodules
    attention = _submodules(sub.self_attention)
    core = getattr(attention, "core_attention", None)
    if getattr(core, "__name__", None) == "DotProductAttention" and hasattr(
        attention, "linear_kv_down_proj"
    ):  # MLA: keys wider than values
        mla = _with_submodules(sub.self_attention, core_attention=MLACoreAttention)
        sub = dataclasses.replace(sub, self_attention=mla)
    experts = getattr(_submodules(sub.mlp), "experts", None)
    if getattr(getattr(experts, "func", None), "__name__", None) == "SequentialMLP":
        sub = dataclasses.replace(sub, mlp=_with_submodules(sub.mlp, experts=_grouped_experts()))
    return dataclasses.replace(layer, submodules=sub)


def _cpu_spec(spec: Any) -> Any:
    """A layer spec, a block spec or a function of the provider returning one, with every
    layer's CPU stand-ins in place."""
    if callable(spec) and not hasattr(spec, "submodules"):
        takes_vp = "vp_stage" in inspect.signature(spec).parameters

        def cpu_spec(config: Any, vp_stage: int | None = None) -> Any:
            built = spec(config, vp_stage=vp_stage) if takes_vp else spec(config)
            return _cpu_spec(built)

        return cpu_spec
    if hasattr(spec, "layer_specs"):  # a block: one spec per layer
        return dataclasses.replace(spec, layer_specs=[_cpu_layer(s) for s in spec.layer_specs])
    return _cpu_layer(spec)


def convert_hf_checkpoint(
    path: str | Path, family: BridgeFamily, overrides: Mapping[str, Any] | None = None
) -> nn.Module:
    """The float32 GPTModel (eval mode) bridge converts the checkpoint at ``path`` into, its
    weights loaded by bridge, as ``family`` says; ``overrides`` go to the provider after
    :data:`~rr_fakes.shims.megatron.bridge_shims.CPU_OVERRIDES`. Call inside
    :func:`~rr_fakes.shims.megatron.bridge_shims.bridge_cpu` and
    :func:`~rr_fakes.shims.megatron.model_parallel`."""
    bridge = importlib.import_module("megatron.bridge")
    auto = bridge.AutoBridge.from_hf_pretrained(str(path), dtype=torch.float32, **family.hf_config)
    provider = auto.to_megatron_provider(load_weights=True)
    provider.transformer_layer_spec = _cpu_spec(provider.transformer_layer_spec)
    fields = dict(CPU_OVERRIDES)
    if family.partial_rotary:
        rope = auto.hf_pretrained.config.rope_parameters
        fields["rotary_percent"] = rope["partial_rotary_factor"]
    provider.apply_overrides_and_finalize(
        dtype=torch.float32, overrides={**fields, **(overrides or {})}
    )
    chunks: list[nn.Module] = provider.provide_distributed_model(wrap_with_ddp=False)
    (model,) = chunks  # no virtual pipeline: one chunk
    return model.eval()
