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

from typing import Any, Unpack

import numpy as np

from rr_core import RouteMeta
from rr_vllm._supported import TRTLLM_CANCELLED
from rr_vllm.decoded import DecodedRoutes, decoded, decoded_one
from rr_vllm.errors import DecodeOptionsError, EngineOutputError
from rr_vllm.fields import attr, reason, token_count
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve
from rr_vllm.samples import (
    IntArray,
    Sample,
    SampleRoutes,
    as_rows,
    check_missing,
    place_rows,
    sample_of,
    unrouted,
)


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


#: The options TensorRT-LLM's decoders read (its rows always start at token 0).
READS = frozenset({"on_abort"})


def _no_start(opts: DecodeOptions, decoder: str) -> DecodeOptions:
    if opts.prompt_start:
        raise DecodeOptionsError(
            f"{decoder}(): TensorRT-LLM has no prompt_start (its rows start at token 0); got "
            f"options with prompt_start={opts.prompt_start}"
        )
    return opts


def _decode(routes: Any, sample: Sample, options: DecodeOptions) -> SampleRoutes | None:
    if sample.aborted:  # masked or dropped as for vLLM
        return unrouted(sample, options)
    if routes is None:
        check_missing(sample.what, sample.finish_reason)
    return place_rows([_moe_rows(routes, sample.what)], sample, options, moe_only=True)


def decode_trtllm_routes(
    routes: Any,
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int,
    num_generated_tokens: int,
    finish_reason: str | None = None,
    what: str = "routed_experts",
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """One TensorRT-LLM ``[N, M, K]`` MoE-layer array (or None) of a sample with P prompt and G
    generated tokens, laid out on the ``all_layers`` axis of the meta. An aborted sample
    (``'cancelled'``) is masked or dropped (option ``on_abort``); otherwise None routes raise
    (D3). One sample (``.only()``); the deprecated form (a RouteMeta, option keywords) returns
    the sample itself."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_trtllm_routes")
    _no_start(opts, "decode_trtllm_routes")
    sample = sample_of(what, num_prompt_tokens, num_generated_tokens)
    one = _decode(routes, sample._replace(finish_reason=_finish(finish_reason, what)), opts)
    return decoded_one(one, opts, legacy)


def decode_trtllm_output(
    output: Any, options: RouteMeta | DecodeOptions, /, **keywords: Unpack[DecodeKeywords]
) -> DecodedRoutes:
    """Every completion of one TensorRT-LLM LLM-API result (``prompt_token_ids`` and
    ``outputs``, each a ``CompletionOutput`` with ``token_ids``, ``finish_reason`` and
    ``routed_experts``), in ``outputs`` order. Option: ``on_abort``."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_trtllm_output")
    _no_start(opts, "decode_trtllm_output")
    what = "TensorRT-LLM result"
    p = token_count(attr(output, "prompt_token_ids", what), f"{what}.prompt_token_ids")
    completions = attr(output, "outputs", what)
    if isinstance(completions, str | bytes) or not hasattr(completions, "__iter__"):
        raise EngineOutputError(f"{what}.outputs must be a list of CompletionOutput")
    samples: list[SampleRoutes | None] = []
    for i, c in enumerate(completions):
        where = f"{what}.outputs[{i}]"
        routes = attr(c, "routed_experts", where)
        g = token_count(attr(c, "token_ids", where), f"{where}.token_ids")
        finish = _finish(attr(c, "finish_reason", where), where)
        sample = sample_of(f"{where}.routed_experts", p, g, finish_reason=finish)
        samples.append(_decode(routes, sample, opts))
    return decoded(samples, opts, legacy)
