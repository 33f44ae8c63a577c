"""Decoding TensorRT-LLM's routed experts (Router Replay, NVIDIA/TensorRT-LLM PR #18397, merged
2026-08; design in RFC issue #17778) into per-sample routes.

Shape legend: T tokens of a sample (prompt + generated), N rows the engine returned, L layer slots
on rr_core's ``all_layers`` axis, M MoE slots, K top-k.

The form, as the PR and RFC state it: ``CompletionOutput.routed_experts`` holds, per token and per
**MoE layer only**, the logical top-k expert ids before expert-load-balancing remaps (captured at
``routing_method.apply()``, ahead of ``_load_balancer_route()``), with the contract
``(seq_len - 1, num_moe_layers, top_k)``: row ``i`` is token ``i`` as the input, the last sampled
token has no row, and there is no ``prompt_start``. rr lays the M MoE columns out on the
``all_layers`` axis at ``meta.moe_slots`` (dense layers stay zero), so a TensorRT-LLM sample
comes out like every vLLM era. The meta names the MoE layers: ``layer_numbers`` 1..L and
``moe_layer_numbers`` the routed ones (a DeepSeek-V3 with three dense layers: 4..61).

Not public, so not assumed: the dtype (any integer dtype is read; negative ids are refused, as
rr cannot tell a sentinel from a wrapped id) and an HTTP form (:func:`decode_trtllm_routes`
takes any ``[N, M, K]`` array or nested list, e.g. parsed from JSON). TensorRT-LLM's
``finish_reason`` ``'cancelled'`` is rr's ``'abort'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rr_core import RouteMeta
from rr_vllm._decode import (
    AbortPolicy,
    IntArray,
    SampleRoutes,
    as_rows,
    check_policy,
    decode_routes_array,
    place_rows,
)
from rr_vllm._errors import EngineOutputError
from rr_vllm._fields import attr, count, reason, token_count
from rr_vllm._supported import TRTLLM_CANCELLED
from rr_vllm._validate import check_all_layers, check_missing, is_aborted


def _finish(value: Any, what: str) -> str | None:
    r = reason(value, f"{what}: finish_reason")
    return "abort" if r in TRTLLM_CANCELLED else r


def _moe_rows(routes: Any, what: str) -> IntArray:
    rows = as_rows(routes, what)
    if rows.dtype.kind == "i" and rows.size and int(rows.min()) < 0:
        n = int(np.argmax((rows < 0).any(axis=(1, 2))))
        raise EngineOutputError(
            f"{what}: row {n} holds a negative expert id ({int(rows[n].min())}); TensorRT-LLM "
            "returns logical ids in [0, num_experts), so this array was wrapped or filled with a "
            "sentinel on the way (store ids as int16 or wider)"
        )
    return rows


def decode_trtllm_routes(
    routes: Any,
    meta: RouteMeta,
    *,
    num_prompt_tokens: int,
    num_generated_tokens: int,
    finish_reason: str | None = None,
    on_abort: AbortPolicy = "mask",
    what: str = "routed_experts",
) -> SampleRoutes | None:
    """One TensorRT-LLM ``[N, M, K]`` MoE-layer array (or None) of a sample with P prompt and G
    generated tokens, laid out on the ``all_layers`` axis of ``meta``. An aborted sample
    (``'cancelled'``) is masked or dropped; otherwise None routes raise (D3)."""
    check_policy(on_abort)
    check_all_layers(meta)
    p = count(num_prompt_tokens, f"{what}: num_prompt_tokens")
    g = count(num_generated_tokens, f"{what}: num_generated_tokens")
    finish_reason = _finish(finish_reason, what)
    if is_aborted(finish_reason):  # masked or dropped as for vLLM
        return decode_routes_array(
            None, meta, num_prompt_tokens=p, num_generated_tokens=g,
            finish_reason=finish_reason, on_abort=on_abort, what=what,
        )  # fmt: skip
    if routes is None:
        check_missing(what, finish_reason)
    return place_rows(
        [_moe_rows(routes, what)],
        meta,
        moe_only=True,
        num_prompt_tokens=p,
        num_tokens=p + g,
        prompt_start=0,
        finish_reason=finish_reason,
        what=what,
    )


def decode_trtllm_output(
    output: Any, meta: RouteMeta, *, on_abort: AbortPolicy = "mask"
) -> list[SampleRoutes | None]:
    """Every completion of one TensorRT-LLM LLM-API result (``prompt_token_ids`` and
    ``outputs``, each a ``CompletionOutput`` with ``token_ids``, ``finish_reason`` and
    ``routed_experts``), in ``outputs`` order."""
    what = "TensorRT-LLM result"
    p = token_count(attr(output, "prompt_token_ids", what), f"{what}.prompt_token_ids")
    completions = attr(output, "outputs", what)
    if isinstance(completions, str | bytes) or not hasattr(completions, "__iter__"):
        raise EngineOutputError(f"{what}.outputs must be a list of CompletionOutput")
    samples: list[SampleRoutes | None] = []
    for i, c in enumerate(completions):
        where = f"{what}.outputs[{i}]"
        samples.append(
            decode_trtllm_routes(
                attr(c, "routed_experts", where),
                meta,
                num_prompt_tokens=p,
                num_generated_tokens=token_count(attr(c, "token_ids", where), f"{where}.token_ids"),
                finish_reason=attr(c, "finish_reason", where),
                on_abort=on_abort,
                what=f"{where}.routed_experts",
            )
        )
    return samples
