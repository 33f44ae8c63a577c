"""vLLM's offline answer: each ``RequestOutput``'s completions read by attribute and decoded.

Shape legend as in :mod:`rr_vllm.samples`. vLLM 0.14-0.20 and 0.22+ return one all-layers
``CompletionOutput.routed_experts`` ``[N, L, K]`` per completion; 0.21 splits it into
``RequestOutput.prompt_routed_experts`` ``[P, M, K]`` and the completion's ``[G-1, M, K]``
generation rows (int16, MoE layers only; rows of -1 were served from the prefix cache), both
None after preemption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Unpack

from rr_core import RouteMeta
from rr_vllm.engine_sources import answered_by_prefill
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import attr, reason, token_count
from rr_vllm.options import DecodeKeywords, DecodeOptions, decode_options
from rr_vllm.samples import (
    BoolArray,
    IntArray,
    Sample,
    SampleRoutes,
    as_rows,
    check_missing,
    decode_rows,
    place_rows,
)


class Completion(NamedTuple):
    """The fields of one ``CompletionOutput`` that decoding reads, checked."""

    what: str
    num_generated_tokens: int
    finish_reason: str | None
    rows: Any


class Request(NamedTuple):
    """The fields of one ``RequestOutput`` that decoding reads, checked; ``prompt_rows`` is
    vLLM 0.21's ``prompt_routed_experts`` (``split``)."""

    request_id: str
    num_prompt_tokens: int
    split: bool
    prompt_rows: Any
    completions: list[Completion]
    prefill: bool = False


def read_request(request_output: Any) -> Request:
    """Read a real or duck-typed ``RequestOutput`` by attribute, each field type-checked, so
    that a foreign object raises :class:`~rr_vllm.EngineOutputError` naming the field."""
    request_id = str(getattr(request_output, "request_id", "?"))
    what = f"request {request_id}"
    ids = attr(request_output, "prompt_token_ids", what)
    p = 0 if ids is None else token_count(ids, f"{what}: prompt_token_ids")
    outputs = attr(request_output, "outputs", what)
    if isinstance(outputs, str | bytes | Mapping) or not isinstance(outputs, Sequence):
        raise EngineOutputError(
            f"{what}: outputs must be a list of CompletionOutput; got {type(outputs).__name__}"
        )
    completions = []
    for i, c in enumerate(outputs):
        where = f"{what}, completion {getattr(c, 'index', i)}"
        completions.append(
            Completion(
                what=where,
                num_generated_tokens=token_count(
                    attr(c, "token_ids", where), f"{where}: token_ids"
                ),
                finish_reason=reason(attr(c, "finish_reason", where), f"{where}: finish_reason"),
                rows=attr(c, "routed_experts", where),
            )
        )
    split = hasattr(request_output, "prompt_routed_experts")  # vLLM 0.21
    prompt_rows = request_output.prompt_routed_experts if split else None
    prefill = answered_by_prefill(getattr(request_output, "kv_transfer_params", None))
    return Request(request_id, p, split, prompt_rows, completions, prefill)


def completion_sample(request: Request, completion: Completion, prompt_start: int) -> Sample:
    """The :class:`~rr_vllm.samples.Sample` of one completion of a read request."""
    p = request.num_prompt_tokens
    return Sample(
        completion.what,
        p,
        p + completion.num_generated_tokens,
        prompt_start,
        completion.finish_reason,
        request.prefill,
    )


def decode_completion(
    request: Request,
    completion: Completion,
    options: DecodeOptions,
    *,
    prompt_start: int,
    out: tuple[IntArray, BoolArray] | None = None,
) -> SampleRoutes | None:
    """One completion of a read request: one all-layers array, or 0.21's split arrays."""
    sample = completion_sample(request, completion, prompt_start)
    if not request.split or sample.aborted:
        return decode_rows(completion.rows, sample, options, out=out)
    if prompt_start:
        raise EngineOutputError(
            f"request {request.request_id}: prompt_start={prompt_start}, but vLLM 0.21 has no "
            "routed_experts_prompt_start (it arrived in 0.22); pass prompt_start=0"
        )
    prompt_rows, gen_rows = request.prompt_rows, completion.rows
    if prompt_rows is None or gen_rows is None:
        if sample.finish_reason is None:
            check_missing(sample.what, None)  # not finished yet: no routes in any era
        raise EngineOutputError(
            f"{sample.what}: vLLM 0.21 returned None for "
            f"{'prompt_routed_experts' if prompt_rows is None else 'routed_experts'} of a "
            f"request that finished with finish_reason={sample.finish_reason!r}. 0.21 drops the "
            "routes of a preempted request (or capture is off): resubmit it, avoid preemption "
            "(more KV-cache memory, fewer concurrent sequences), or upgrade to vLLM >= 0.22"
        )
    blocks = [as_rows(prompt_rows, f"{sample.what} prompt"), as_rows(gen_rows, sample.what)]
    return place_rows(blocks, sample, options, moe_only=True, out=out)


#: The options :func:`decode_vllm_output` reads.
READS = frozenset({"prompt_start", "on_abort", "engine_config"})


def decode_vllm_output(
    request_output: Any,
    options: RouteMeta | DecodeOptions,
    /,
    **keywords: Unpack[DecodeKeywords],
) -> list[SampleRoutes | None]:
    """Routes of each completion of a vLLM ``RequestOutput`` (real or duck-typed, any era).

    Options: ``prompt_start``, the ``SamplingParams.routed_experts_prompt_start`` the request
    was sent with (0.22+), and ``on_abort``. The meta is on the all_layers axis; its
    ``moe_layer_numbers`` re-expand 0.21's MoE-only arrays. A missing or mistyped field raises
    :class:`~rr_vllm.EngineOutputError`.
    """
    opts = decode_options(options, keywords, reads=READS, decoder="decode_vllm_output")
    request = read_request(request_output)
    return [
        decode_completion(request, c, opts, prompt_start=opts.prompt_start)
        for c in request.completions
    ]
