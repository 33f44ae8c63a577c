"""TensorRT-LLM's LLM-API result with Router Replay (NVIDIA/TensorRT-LLM PR #18397, RFC #17778).

What it mirrors: a result with ``prompt_token_ids`` and ``outputs``, each a ``CompletionOutput``
(``index``, ``text``, ``token_ids``, ``finish_reason`` in ``stop`` / ``length`` / ``timeout`` /
``cancelled``) whose ``routed_experts`` is ``(seq_len - 1, num_moe_layers, top_k)``: the MoE
layers' columns only, one row per input token, none for the last sampled token. The dtype is not
stated publicly; int16 (what the PR's fused routing kernels write) is the default here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class TrtllmCompletionOutput:
    """The fields of ``tensorrt_llm.executor.result.CompletionOutput`` rr reads."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    routed_experts: Any = None


@dataclass
class TrtllmRequestOutput:
    """The fields of ``tensorrt_llm.llmapi.RequestOutput`` rr reads."""

    request_id: int
    prompt_token_ids: list[int]
    outputs: list[TrtllmCompletionOutput]


def trtllm_request_output(
    prompt_ids: Sequence[int],
    completions: Sequence[tuple[Sequence[int], np.ndarray | None]],
    moe_slots: Sequence[int],
    *,
    dtype: Any = np.int16,
    finish_reasons: Sequence[str | None] | None = None,
) -> TrtllmRequestOutput:
    """A result from each completion's ``(generated_ids, routes_TLK)``: ``routes_TLK`` holds the
    all-layers rows of the sample's first ``T - 1`` tokens (None: capture off); TensorRT-LLM
    keeps the ``moe_slots`` columns."""
    outputs = []
    for i, (generated, routes_TLK) in enumerate(completions):
        rows = None if routes_TLK is None else np.ascontiguousarray(
            np.asarray(routes_TLK)[:, list(moe_slots)].astype(dtype)
        )  # fmt: skip
        reason = "length" if finish_reasons is None else finish_reasons[i]
        outputs.append(TrtllmCompletionOutput(i, "", list(generated), reason, rows))
    return TrtllmRequestOutput(0, list(prompt_ids), outputs)
