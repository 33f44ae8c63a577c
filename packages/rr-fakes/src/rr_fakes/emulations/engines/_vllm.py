"""Emulated vLLM outputs, per era, from prompt ids, generated ids and routes.

What it mirrors (``vllm-facts.md``, "the output, by version"), with P prompt tokens and G
generated tokens; row i is absolute position ``prompt_start + i`` of prompt + generated ids,
routed when that token was the input, and the last sampled token has no row:

- 0.14-0.20: ``CompletionOutput.routed_experts``, int32, P+G-1 rows, all layers;
- 0.21: ``RequestOutput.prompt_routed_experts`` (the P prefill rows) and
  ``CompletionOutput.routed_experts`` (the G-1 decode rows), int16, MoE layers only, -1 on
  prefix-cached rows, both None after preemption;
- 0.22-0.31 and 0.32+: ``CompletionOutput.routed_experts``, uint8 when E <= 256 else uint16,
  P+G-1-prompt_start rows, all layers;
- 0.22.0-0.29.x: ``prompt_start == P`` trips the scheduler's ``assert prompt_start < P`` and the
  EngineCore dies (vLLM #55750; given ``engine_version``, :class:`EngineDeadError` is raised);
- cached-prefix omission (vLLM RFC #56402, PRs #57025 / #57966, unreleased, on the 0.32+
  aux-output store): rows start at ``max(prompt_start, num_cached_tokens)``.

Dense layers are all-zero rows on the all-layers axis: the caller's routes carry them.

Shapes: N rows, L layer slots, K top-k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rr_fakes.emulations.engines._eras import VllmEra, era_dtype
from rr_fakes.emulations.engines._faults import (
    NO_FAULTS,
    Faults,
    IntArray,
    corrupt_ids,
    cut_rows,
    faulted_rows,
    finish,
    overwrite_layer0,
)
from rr_fakes.emulations.engines._objects import construct, output_classes


class EngineDeadError(RuntimeError):
    """vLLM's error once the EngineCore died: this request and every later one fail (HTTP 500
    over the server)."""


#: Releases whose scheduler asserts ``routed_experts_prompt_start < P`` (checked in each wheel's
#: ``vllm/v1/core/sched/scheduler.py``; 0.30.0 has ``<=``, vLLM PR #56844).
_WHOLE_PROMPT_START_CRASHES = ((0, 22), (0, 29))


def _crashes_on_whole_prompt(engine_version: str | None) -> bool:
    if engine_version is None:
        return False
    major, minor = (int(x) for x in engine_version.split("+")[0].split(".")[:2])
    return _WHOLE_PROMPT_START_CRASHES[0] <= (major, minor) <= _WHOLE_PROMPT_START_CRASHES[1]


class BlockObjectStoreError(RuntimeError):
    """vLLM 0.32+'s error when a prefix-cache hit needs route rows that the aux-output store
    already evicted (the fix is a larger ``max_bytes``)."""


def as_routes(routes: Any) -> IntArray:
    """A numpy ``[N, L, K]`` integer array from numpy or a CPU torch tensor."""
    array = routes.numpy() if hasattr(routes, "numpy") else np.asarray(routes)
    if array.ndim != 3 or array.dtype.kind not in "iu":
        raise ValueError(
            f"routes must be an integer [N, L, K] array; got {array.dtype} {array.shape}"
        )
    return array


def vllm_request_output(
    era: VllmEra | str,
    *,
    prompt_ids: Sequence[int],
    generated_ids: Sequence[int],
    routes_TLK: Any,
    num_experts: int,
    moe_layer_numbers: Sequence[int] | None = None,
    prompt_start: int = 0,
    cached_prefix: int = 0,
    omit_cached_prefix: bool = False,
    engine_version: str | None = None,
    preempted: bool = False,
    evicted: bool = False,
    finish_reason: str = "length",
    request_id: str = "0",
    faults: Faults = NO_FAULTS,
    use_real_vllm: bool | None = None,
) -> Any:
    """A finished ``RequestOutput`` (one completion) as the era's engine returns it.

    ``routes_TLK`` holds ``P+G-1`` rows on the all-layers axis (dense layers as zero rows).
    ``moe_layer_numbers`` (1-based, default: every layer) picks 0.21's MoE-only axis.
    ``prompt_start`` is ``SamplingParams.routed_experts_prompt_start`` (0.22+; ``0..P``, else
    ValueError as vLLM's validation). ``cached_prefix`` prompt tokens came from the prefix
    cache (``num_cached_tokens``; 0.21 returns -1 on their rows). ``preempted`` makes 0.21
    return None; ``evicted`` makes 0.32+ raise :class:`BlockObjectStoreError`.
    ``omit_cached_prefix`` (0.32+ era, the server flag ``--enable-omit-prefix-routed-experts``
    of the open PRs) starts the rows at ``max(prompt_start, cached_prefix)``.
    ``engine_version`` (e.g. ``"0.28.0"``) makes ``prompt_start == P`` raise
    :class:`EngineDeadError` on 0.22-0.29, as their EngineCore dies.
    ``use_real_vllm``: None builds the real classes when ``vllm`` imports.
    """
    era = VllmEra(era)
    p, g = len(prompt_ids), len(generated_ids)
    routes = as_routes(routes_TLK)
    if g < 1 or routes.shape[0] != p + g - 1:
        raise ValueError(
            f"routes have {routes.shape[0]} rows; P+G-1 = {p + g - 1} for P={p}, G={g} (G >= 1)"
        )
    if not era.has_prompt_start and prompt_start:
        raise ValueError(f"routed_experts_prompt_start does not exist in vLLM {era.value}")
    if not 0 <= prompt_start <= p:
        raise ValueError(f"routed_experts_prompt_start={prompt_start} outside the valid 0..{p}")
    if not 0 <= cached_prefix <= p:
        raise ValueError(f"cached_prefix={cached_prefix} outside 0..{p}")
    if omit_cached_prefix and era is not VllmEra.V0_32:
        raise ValueError(
            f"cached-prefix omission is a 0.32+ (aux-output store) form, not {era.value}"
        )
    if prompt_start == p > 0 and _crashes_on_whole_prompt(engine_version):
        raise EngineDeadError(
            f"EngineCore died: AssertionError in the scheduler (prompt_start={prompt_start} is "
            f"not < num_prompt_tokens={p}); vLLM {engine_version} answers 500 from now on"
        )
    if (preempted and era is not VllmEra.V0_21) or (evicted and era is not VllmEra.V0_32):
        raise ValueError(f"preempted is a 0.21 behaviour and evicted a 0.32+ one, not {era.value}")
    if evicted:
        raise BlockObjectStoreError(
            f"request {request_id}: prefix hit needs route rows evicted from the aux-output "
            "store; raise max_bytes"
        )
    start = max(prompt_start, cached_prefix) if omit_cached_prefix else prompt_start
    dtype = era_dtype(era, num_experts)
    extra: dict[str, Any] = {}
    if era is VllmEra.V0_21:
        rows = corrupt_ids(routes, faults)[start:]
        slots = [n - 1 for n in moe_layer_numbers] if moe_layer_numbers else range(rows.shape[1])
        rows = rows[:, list(slots)]
        rows[:cached_prefix] = -1
        rows = overwrite_layer0(cut_rows(rows, faults), faults, num_experts)
        gone = preempted or faults.missing
        prompt_part = None if gone else finish(rows[:p], dtype, faults)
        routed = None if gone else finish(rows[p:], dtype, faults)
        extra["prompt_routed_experts"] = prompt_part
    else:
        rows = faulted_rows(routes, faults, start, num_experts)
        routed = None if faults.missing else finish(rows, dtype, faults)
    completion_cls, request_cls = output_classes(use_real_vllm)
    completion = construct(
        completion_cls,
        {
            "index": 0,
            "text": "",
            "token_ids": list(generated_ids),
            "cumulative_logprob": None,
            "logprobs": None,
            "routed_experts": routed,
            "finish_reason": "abort" if faults.aborted else finish_reason,
            "stop_reason": None,
        },
    )
    return construct(
        request_cls,
        {
            "request_id": request_id,
            "prompt": None,
            "prompt_token_ids": list(prompt_ids),
            "prompt_logprobs": None,
            "outputs": [completion],
            "finished": True,
            "num_cached_tokens": cached_prefix,
            **extra,
        },
    )
