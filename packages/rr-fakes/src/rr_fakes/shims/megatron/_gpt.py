"""Tiny real ``GPTModel`` MoE models with Megatron's local (non Transformer Engine) spec, and a
training step through Megatron's own pipeline schedules.

Call everything here inside :func:`rr_fakes.shims.megatron.model_parallel` (or a launched rank with
``sizes``): the builders read the parallel sizes from Megatron's parallel state, so one config
builds the right stage on every rank.

MTP (``mtp_num_layers``) builds and runs forward and backward on CPU on the lines whose test
says so (see the harness tests); Megatron places the MTP block on the last pipeline stage only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from rr_fakes.shims.megatron._flags import megatron_flags

#: Megatron's full activation recompute, one layer per checkpoint (pass as ``extra``).
RECOMPUTE: Mapping[str, Any] = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}


@dataclass(frozen=True, kw_only=True)
class TinyGPTConfig:
    """Sizes and MoE settings of a tiny GPTModel; ``extra`` passes any other TransformerConfig
    field through unchanged."""

    num_layers: int = 4
    hidden_size: int = 16
    num_attention_heads: int = 2
    ffn_hidden_size: int = 32
    num_experts: int = 8
    top_k: int = 2
    moe_layer_freq: int | Sequence[int] = 1
    score_function: Literal["softmax", "sigmoid"] = "softmax"
    aux_loss_coeff: float = 0.0
    dispatcher: Literal["alltoall", "allgather"] = "alltoall"
    expert_bias: bool = False
    mtp_num_layers: int | None = None
    vocab_size: int = 64
    max_sequence_length: int = 32
    extra: Mapping[str, Any] = field(default_factory=dict)


def _megatron(name: str) -> Any:
    return importlib.import_module(f"megatron.core.{name}")


def transformer_config(config: TinyGPTConfig) -> Any:
    """The TransformerConfig for ``config`` on this rank: float32, CPU initialisation, parallel
    sizes from the initialised parallel state, and every fusion off (they are torch.compile'd
    or TE kernels; CPU runs take the plain torch path)."""
    ps = _megatron("parallel_state")
    freq = config.moe_layer_freq
    fields: dict[str, Any] = {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "ffn_hidden_size": config.ffn_hidden_size,
        "num_moe_experts": config.num_experts,
        "moe_router_topk": config.top_k,
        "moe_layer_freq": freq if isinstance(freq, int) else list(freq),
        "moe_router_score_function": config.score_function,
        "moe_aux_loss_coeff": config.aux_loss_coeff,
        "moe_router_load_balancing_type": "aux_loss" if config.aux_loss_coeff > 0 else "none",
        "moe_token_dispatcher_type": config.dispatcher,
        "moe_router_enable_expert_bias": config.expert_bias,
        "moe_grouped_gemm": False,
        "mtp_num_layers": config.mtp_num_layers,
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "virtual_pipeline_model_parallel_size": ps.get_virtual_pipeline_model_parallel_world_size(),
        "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
        "use_cpu_initialization": True,
        "params_dtype": torch.float32,
        "pipeline_dtype": torch.float32,
        "add_bias_linear": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "bias_dropout_fusion": False,
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "persist_layer_norm": False,
    }
    if config.mtp_num_layers:
        fields["mtp_loss_scaling_factor"] = (
            0.1  # Megatron's training default; None breaks 0.12-0.15
        )
    if config.expert_bias:
        fields["moe_router_bias_update_rate"] = 1e-3
    fields.update(config.extra)
    configs = _megatron("transformer.transformer_config")
    if fields.get("multi_latent_attention"):  # MLA's latent sizes live in their own config
        return configs.MLATransformerConfig(**fields)
    return configs.TransformerConfig(**fields)


def _stage_flags(vp_stage: int | None) -> tuple[bool, bool]:
    """(pre_process, post_process) of this rank's chunk ``vp_stage``, as Megatron's
    ``get_model`` computes them (0.12 reads the virtual rank from global state)."""
    ps = _megatron("parallel_state")
    if vp_stage is None:
        return ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    if megatron_flags().vp_stage_kwarg:
        first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        return first, last
    ps.set_virtual_pipeline_model_parallel_rank(vp_stage)
    return ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()


def _build_one(config: TinyGPTConfig, tc: Any, vp_stage: int | None) -> nn.Module:
    specs = _megatron("models.gpt.gpt_layer_specs")
    gpt_model = _megatron("models.gpt.gpt_model")
    stage_kw = {"vp_stage": vp_stage} if megatron_flags().vp_stage_kwarg else {}
    # First: on 0.12 this also sets the global virtual rank, which the block spec reads for its
    # layer offset (and so for which layers are MoE).
    pre_process, post_process = _stage_flags(vp_stage)
    block_spec = specs.get_gpt_decoder_block_spec(tc, use_transformer_engine=False, **stage_kw)
    mtp_spec = None
    if config.mtp_num_layers:
        mtp_spec = specs.get_gpt_mtp_block_spec(
            tc, block_spec.layer_specs[-1], use_transformer_engine=False, **stage_kw
        )
    model: nn.Module = gpt_model.GPTModel(
        config=tc,
        transformer_layer_spec=block_spec,
        vocab_size=config.vocab_size,
        max_sequence_length=config.max_sequence_length,
        pre_process=pre_process,
        post_process=post_process,
        position_embedding_type="rope",
        mtp_block_spec=mtp_spec,
        **stage_kw,
    )
    return model


def build_gpt_chunks(config: TinyGPTConfig) -> list[nn.Module]:
    """This rank's model chunks: one GPTModel per virtual pipeline stage (one without VPP), as
    Megatron's ``get_model`` returns them."""
    tc = transformer_config(config)
    vp_size = tc.virtual_pipeline_model_parallel_size
    if vp_size is None:
        return [_build_one(config, tc, None)]
    ps = _megatron("parallel_state")
    try:
        return [_build_one(config, tc, vp) for vp in range(vp_size)]
    finally:
        if not megatron_flags().vp_stage_kwarg:
            ps.set_virtual_pipeline_model_parallel_rank(0)


def build_gpt(config: TinyGPTConfig) -> nn.Module:
    """This rank's GPTModel (no virtual pipeline)."""
    chunks = build_gpt_chunks(config)
    if len(chunks) != 1:
        raise ValueError("virtual pipelining is on; use build_gpt_chunks()")
    return chunks[0]


def gpt_inputs(batch: int, seq: int, vocab: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids, positions and next-token labels ``[batch, seq]`` for GPTModel.forward."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    positions = torch.arange(seq).expand(batch, seq).contiguous()
    return {
        "input_ids": tokens[:, :-1].contiguous(),
        "position_ids": positions,
        "labels": tokens[:, 1:].contiguous(),
    }


def _loss(output_BS: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = output_BS.float().mean()
    return loss, {"lm loss": loss.detach()}


def train_step(
    chunks: nn.Module | Sequence[nn.Module],
    microbatches: Sequence[Mapping[str, torch.Tensor]],
    controller: Any = None,
    *,
    forward_only: bool = False,
) -> list[float]:
    """One forward (and backward) over ``microbatches`` through Megatron's schedule for this
    parallel layout (no pipelining, 1F1B, or interleaved 1F1B with VPP). With a
    :class:`rr_core.ReplayController` the forward step is wrapped as an RL trainer drives rr
    (:func:`rr_megatron_compat.replay_forward_step`): each forward runs inside
    ``controller.microbatch(i)`` with its output tracked, in whatever order the schedule runs
    the chunks. Returns the mean token loss of each micro-batch on the last pipeline stage,
    nothing elsewhere."""
    schedules = _megatron("pipeline_parallel.schedules")
    models = list(chunks) if isinstance(chunks, Sequence) else [chunks]
    batch, seq = microbatches[0]["input_ids"].shape

    def forward_step(data_iterator: Iterator[Mapping[str, torch.Tensor]], model: nn.Module) -> Any:
        data = next(data_iterator)
        output = model(
            data["input_ids"], data["position_ids"], attention_mask=None, labels=data["labels"]
        )
        return output, _loss

    if controller is not None:
        from rr_megatron_compat._schedule import replay_forward_step

        forward_step = replay_forward_step(controller, forward_step)
    iterators = [iter(microbatches) for _ in models]
    forward_backward: Callable[..., Any] = schedules.get_forward_backward_func()
    losses = forward_backward(
        forward_step_func=forward_step,
        data_iterator=iterators if len(models) > 1 else iterators[0],
        model=models if len(models) > 1 else models[0],
        num_microbatches=len(microbatches),
        seq_length=seq,
        micro_batch_size=batch,
        forward_only=forward_only,
    )
    return [float(item["lm loss"]) for item in losses]
