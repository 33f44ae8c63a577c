"""The tiny batch and model the verl engine tests share: four sequences of different prompt and
response lengths, and a 4-layer MoE GPTModel with or without full activation recompute."""

from __future__ import annotations

from typing import Any

from rr_fakes.shims.megatron._gpt import RECOMPUTE, TinyGPTConfig

__all__ = ["BATCHINGS", "LENGTHS", "PROMPTS", "RECOMPUTE", "RESPONSES", "tiny_config"]

PROMPTS = (3, 5, 2, 4)
RESPONSES = (4, 2, 6, 3)
LENGTHS = tuple(p + r for p, r in zip(PROMPTS, RESPONSES, strict=True))
#: ``verl_batch`` micro-batching of that batch: one micro-batch, one per sequence (THD batch
#: size 1: the logits are a view verl divides in place), or verl's dynamic batch size
#: (12-token budget; it reorders the sequences).
BATCHINGS: dict[str, dict[str, int]] = {
    "one": {"micro_batch_size": len(PROMPTS)},
    "per_sequence": {"micro_batch_size": 1},
    "dynamic": {"max_token_len": 12},
}


def tiny_config(*, recompute: bool = False, freq: Any = 1, num_layers: int = 4) -> TinyGPTConfig:
    """A tiny GPTModel config: ``freq`` is ``moe_layer_freq`` (``[0, 1, 1, 1]``: dense first)."""
    return TinyGPTConfig(
        num_layers=num_layers, moe_layer_freq=freq, extra=RECOMPUTE if recompute else {}
    )
