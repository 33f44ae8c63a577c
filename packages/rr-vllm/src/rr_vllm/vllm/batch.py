"""A whole rollout batch of vLLM outputs straight into one validated route batch.

Shape legend: N rows of the batch (every token of every completion), L layer slots, K top-k.

:func:`decode_vllm_output` places each completion in arrays of its own, which
:func:`~rr_vllm.validate_samples` then concatenates: two copies, and the first lands in many
small fresh arrays, each page of which the kernel faults in separately. Here every completion's
rows are copied once, into their place in a single batch buffer, the completions split across
``torch.get_num_threads()`` threads (numpy's copies release the GIL). The buffer is
:func:`rr_core.buffers.recycled`: the memory of an earlier batch that nothing references any
more, already mapped, so a steady rollout loop copies at the speed of a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

import numpy as np
import torch

from rr_core import RouteBatch, RouteMeta, RRError
from rr_core.buffers import recycled
from rr_core.threads import over_ranges
from rr_vllm.engine_config import EngineConfig
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import count
from rr_vllm.options import DecodeOptions, decode_options
from rr_vllm.samples import is_aborted
from rr_vllm.validate import batch_samples, check_all_layers, check_logical
from rr_vllm.vllm.decode import Request, decode_completion, read_request


class BatchKeywords(TypedDict, total=False):
    """The options :func:`decode_vllm_batch` reads, with ``prompt_start`` also one value per
    request."""

    prompt_start: int | Sequence[int]
    allow_all_zero: bool
    allow_physical: bool
    logical_experts: int | None
    validate: bool
    engine_config: EngineConfig | None


def _direct(requests: Sequence[Request], dtype: np.dtype[Any]) -> bool:
    """Whether every completion's rows can be copied into the batch as they are: one array per
    completion (not vLLM 0.21's split arrays) already in the batch's dtype (narrowing waits for
    rr_core's range check)."""
    for r in requests:
        if r.split:
            return False
        for c in r.completions:
            rows_dtype = getattr(c.rows, "dtype", None)
            if not is_aborted(c.finish_reason) and not (
                isinstance(rows_dtype, np.dtype) and rows_dtype == dtype
            ):
                return False
    return True


#: The options :func:`decode_vllm_batch` reads (``prompt_start`` also as one per request).
READS = frozenset(
    {"prompt_start", "allow_all_zero", "allow_physical", "logical_experts", "validate"}
    | {"engine_config"}
)


def decode_vllm_batch(
    request_outputs: Sequence[Any],
    options: RouteMeta | DecodeOptions,
    /,
    **keywords: Unpack[BatchKeywords],
) -> RouteBatch:
    """Every completion of every vLLM ``RequestOutput`` (request-major, as
    :func:`~rr_vllm.flatten_completions` orders them) as one validated all-layers
    :class:`~rr_core.RouteBatch`, with aborted requests masked.

    The same result and errors as ``validate_samples(flatten_completions([decode_vllm_output(r,
    options) for r in request_outputs]), meta, ...)``; when the engine's arrays are already in
    the batch's dtype (vLLM 0.22+ returns uint8 up to 256 experts) each is copied once, straight
    into the batch.

    ``prompt_start`` is the ``routed_experts_prompt_start`` each request was sent with: the
    options' one value for all, or (keyword) one per request, in ``request_outputs`` order (each
    request's completions share it), as a rollout's multi-turn continuations and fresh prompts
    differ.

    ``validate=False`` skips rr_core's id checks (range, K distinct ids, empty dense slots, E1),
    for a caller that runs them itself later (``pack_batch_for_verl(..., validate=True)``);
    shapes, row counts, missing routes and E2 are checked either way.
    """
    per_request = keywords.get("prompt_start")
    single = {k: v for k, v in keywords.items() if k != "prompt_start" or isinstance(v, int)}
    opts = decode_options(options, single, reads=READS, decoder="decode_vllm_batch")
    if opts.on_abort != "mask":
        raise EngineOutputError(
            f"decode_vllm_batch masks aborted requests (their tokens stay in the batch); got "
            f"on_abort={opts.on_abort!r}: decode with decode_vllm_output to drop them"
        )
    meta = opts.meta
    check_all_layers(meta)
    if isinstance(request_outputs, str | bytes | Mapping) or not isinstance(
        request_outputs, Sequence
    ):
        raise EngineOutputError(
            f"request_outputs must be a list of RequestOutput; got {type(request_outputs).__name__}"
        )
    starts = _prompt_starts(
        opts.prompt_start if per_request is None or isinstance(per_request, int) else per_request,
        len(request_outputs),
    )
    requests = [read_request(r) for r in request_outputs]
    try:
        return _decode_batch(requests, starts, opts)
    except RRError as e:
        if per_request is not None and not isinstance(per_request, int):
            raise  # one start per request was given: the error is about those
        implied = _implied_starts(requests, starts)
        if len(set(implied)) == 1:  # one start for all: the request's own error says it (G4, D1)
            raise
        raise EngineOutputError(
            f"{e}. The requests' row counts say they were sent with different prompt starts "
            f"(routed_experts_prompt_start {implied}, one per request), not {starts[0]} for "
            f"all: pass prompt_start={implied} (one per request, in request_outputs order)"
        ) from e


def _implied_starts(requests: Sequence[Request], starts: list[int]) -> list[int]:
    """Each request's prompt start as its first completion's row count implies it
    (``P + G - 1 - rows``), where that is a start the request could be sent with."""
    implied = list(starts)
    for i, r in enumerate(requests):
        for c in r.completions:
            rows = getattr(c.rows, "shape", None)
            if r.split or not rows:
                continue
            start = r.num_prompt_tokens + c.num_generated_tokens - 1 - int(rows[0])
            if 0 <= start <= r.num_prompt_tokens:
                implied[i] = start
            break
    return implied


def _decode_batch(requests: list[Request], starts: list[int], opts: DecodeOptions) -> RouteBatch:
    meta, dtype = opts.meta, opts.id_dtype
    flat = [(r, c, start) for r, start in zip(requests, starts, strict=True) for c in r.completions]
    if not _direct(requests, dtype):
        samples = [decode_completion(r, c, opts, prompt_start=start) for r, c, start in flat]
        return batch_samples(
            samples,
            meta,
            allow_all_zero=opts.allow_all_zero,
            allow_physical=opts.allow_physical,
            logical_experts=opts.logical_experts,
            validate=opts.validate,
        )
    lengths = [
        r.num_prompt_tokens + c.num_generated_tokens for r in requests for c in r.completions
    ]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    values_NLK = recycled((int(offsets[-1]), opts.layer_slots, opts.top_k), dtype)
    valid_N = np.zeros(int(offsets[-1]), dtype=bool)  # each sample zeroes what it skips
    logical = None if opts.allow_physical else opts.logical_experts

    def place(start: int, stop: int) -> None:  # completions [start, stop), in order
        for i in range(start, stop):
            r, c, prompt_start = flat[i]
            rows = slice(int(offsets[i]), int(offsets[i + 1]))
            sample = decode_completion(
                r, c, opts, prompt_start=prompt_start, out=(values_NLK[rows], valid_N[rows])
            )
            if logical is not None and sample is not None:
                check_logical(sample.routes_TLK, sample.valid_T, meta, logical, where=f"sample {i}")

    # the first error in completion order is raised: each thread runs its range in order
    over_ranges(len(flat), 1, place)
    return RouteBatch(
        torch.from_numpy(values_NLK),
        torch.from_numpy(offsets),
        torch.from_numpy(valid_N),
        meta,
        validate=opts.validate,
        allow_all_zero=opts.allow_all_zero,
    )


def _prompt_starts(prompt_start: object, num_requests: int) -> list[int]:
    """One ``prompt_start`` per request: the value given for all, or the sequence given."""
    if isinstance(prompt_start, int) and not isinstance(prompt_start, bool):
        return [prompt_start] * num_requests
    if isinstance(prompt_start, str | bytes) or not isinstance(prompt_start, Sequence):
        raise EngineOutputError(
            f"prompt_start must be an int or one int per request; got {type(prompt_start).__name__}"
        )
    starts = list(prompt_start)
    if len(starts) != num_requests:
        raise EngineOutputError(
            f"prompt_start has {len(starts)} values for {num_requests} requests; pass one per "
            "request (in request_outputs order) or a single int"
        )
    for i, start in enumerate(starts):
        if not isinstance(start, int) or isinstance(start, bool):
            raise EngineOutputError(f"prompt_start[{i}] must be an int; got {type(start).__name__}")
    return [count(start, f"prompt_start[{i}]") for i, start in enumerate(starts)]
