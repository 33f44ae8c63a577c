"""The report: :class:`DemoResult`, and the arithmetic of its figures (routes the trainer used
against the rollout's, log-probs against the engine's, bytes per token of a codec).

Shapes: B sequences, S padded length, L layer slots (all layers), K top-k, E experts,
N sampled tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rr_core import RouteBatch, encode_routes


@dataclass(kw_only=True)
class DemoResult:
    """The figures the demo reports (``--json`` prints them)."""

    backend: str = "megatron"
    megatron_core_version: str | None = None  # the megatron backend
    transformers_version: str | None = None  # the transformers backend
    model_type: str | None = None  # the transformers family
    vllm_objects: str
    mismatch_without_replay: float
    mismatch_with_replay: float
    kl_without_replay: float
    kl_with_replay: float
    logprob_abs_diff_without_replay: float
    logprob_abs_diff_with_replay: float
    bytes_per_token: dict[str, float]
    record_file_bytes: int
    train_loss_with_replay: float
    layers: list[int] = field(default_factory=list)
    mismatch_per_layer_without_replay: list[float] = field(default_factory=list)
    mismatch_per_layer_with_replay: list[float] = field(default_factory=list)
    seconds: float = 0.0
    engine: str = "emulated"  # the rollout engine that ran: "vllm" or "emulated"
    engine_reason: str = ""  # why that engine
    engine_version: str | None = None  # the real engine's vLLM release
    engine_dtype: str | None = None  # the real engine's dtype
    checkpoint: str | None = None  # the real engine's checkpoint family


def mismatch_per_layer(
    used: dict[int, torch.Tensor], routes_BSLK: torch.Tensor, valid_BS: torch.Tensor
) -> list[float]:
    """Per MoE layer (ascending): share of valid (token, layer) rows whose expert set in the
    trainer (``used[layer]``, bool ``[B, S, E]``) differs from the rollout's (slot layer - 1 of
    the all-layers axis)."""
    shares = []
    for layer in sorted(used):
        used_BSE = used[layer]
        target_BSK = routes_BSLK[:, :, layer - 1].long()
        want_BSE = torch.zeros_like(used_BSE).scatter(2, target_BSK, True)
        differs_BS = (used_BSE != want_BSE).any(dim=-1) & valid_BS
        shares.append(float(differs_BS.sum()) / max(1, int(valid_BS.sum())))
    return shares


def kl_k3(train_N: torch.Tensor, rollout_N: torch.Tensor) -> tuple[float, float]:
    """Mean |delta log p| and the k3 estimate of KL(rollout || trainer) on rollout samples."""
    log_ratio = train_N - rollout_N
    k3 = torch.expm1(log_ratio) - log_ratio
    return float(log_ratio.abs().mean()), float(k3.mean())


def bytes_per_token(batch: RouteBatch, codec: str) -> float:
    """The codec's payload bytes per valid token of the batch."""
    enc = encode_routes(batch, codec)
    return float(enc.payload.numel()) / max(1, int(batch.valid_N.sum()))
