"""vLLM's offline answer: ``RequestOutput``s read by attribute, decoded, and batched.

Shape legend as in :mod:`rr_vllm.samples`; N rows of a batch (every token of every completion).
vLLM 0.14-0.20 and 0.22+ return one all-layers ``CompletionOutput.routed_experts`` ``[N, L, K]``
per completion; 0.21 splits it into ``RequestOutput.prompt_routed_experts`` ``[P, M, K]`` and the
completion's ``[G-1, M, K]`` generation rows (int16, MoE layers only; rows of -1 were served from
the prefix cache), both None after preemption.

:func:`decode_vllm_output` reads the requests now and places their rows when the samples are
first read, or straight into the batch on ``to_batch()``: every completion's rows are copied
once, into their place in a single batch buffer, the completions split across
``torch.get_num_threads()`` threads (numpy's copies release the GIL). The buffer is
:func:`rr_core.buffers.recycled`: the memory of an earlier batch that nothing references any
more, already mapped, so a steady rollout loop copies at the speed of a copy. Reading, placing
and batching live here together so that a batch's rows pass each module once: this module, then
:mod:`rr_vllm.samples` (placing), then :mod:`rr_vllm.validate` (E2), then rr_core.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict, TypeVar, Unpack

import numpy as np
import torch

from rr_core import RouteBatch, RouteMeta, RRError
from rr_core.buffers import recycled
from rr_core.threads import over_ranges
from rr_vllm.decoded import DecodedRoutes
from rr_vllm.engine_config import EngineConfig
from rr_vllm.engine_sources import answered_by_prefill
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import attr, count, reason, token_count
from rr_vllm.options import DecodeKeywords, DecodeOptions, decode_options, resolve
from rr_vllm.samples import (
    ABORT_REASONS,
    BoolArray,
    IntArray,
    Sample,
    SampleRoutes,
    as_rows,
    check_missing,
    decode_rows,
    place_rows,
)
from rr_vllm.validate import batch_decoded, check_logical

T = TypeVar("T")


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


def _requests(request_outputs: Any) -> list[Any]:
    """One ``RequestOutput``, or a sequence of them, as a list."""
    if hasattr(request_outputs, "outputs"):
        return [request_outputs]
    if isinstance(request_outputs, str | bytes | Mapping) or not isinstance(
        request_outputs, Sequence
    ):
        raise EngineOutputError(
            "request_outputs must be a RequestOutput or a list of them; got "
            f"{type(request_outputs).__name__}"
        )
    return list(request_outputs)


class VllmRoutes(DecodedRoutes):
    """:class:`~rr_vllm.DecodedRoutes` of read ``RequestOutput``s: each completion's rows are
    placed when the samples are first read, or straight into the batch by :meth:`to_batch`
    (the one copy). ``starts`` are the prompt starts each request was sent with."""

    __slots__ = ("_given", "_requests", "_starts")

    def __init__(
        self, requests: list[Request], starts: list[int], options: DecodeOptions, given: bool
    ) -> None:
        self._samples, self.options = None, options  # decoded on first read
        self._requests, self._starts, self._given = requests, starts, given

    def _flat(self) -> list[tuple[Request, Completion, int]]:
        return [
            (r, c, start)
            for r, start in zip(self._requests, self._starts, strict=True)
            for c in r.completions
        ]

    @property
    def samples(self) -> list[SampleRoutes | None]:
        if self._samples is None:
            self._samples = self._explained(
                lambda: [
                    decode_completion(r, c, self.options, prompt_start=start)
                    for r, c, start in self._flat()
                ]
            )
        return self._samples

    def __len__(self) -> int:
        return sum(len(r.completions) for r in self._requests)

    def to_batch(self) -> RouteBatch:
        """Every completion as one validated all-layers :class:`~rr_core.RouteBatch`, aborted
        requests masked: the result and errors of :meth:`DecodedRoutes.to_batch`; where the
        engine's arrays are already in the batch's dtype (vLLM 0.22+ returns uint8 up to 256
        experts), and the samples were not read yet, each is copied once, into the batch."""
        if self.options.on_abort != "mask":
            raise EngineOutputError(
                f"to_batch() masks aborted requests (their tokens stay in the batch); the routes "
                f"were decoded with on_abort={self.options.on_abort!r}: decode with "
                "on_abort='mask' to batch them"
            )
        if self._samples is not None or not _direct(self._requests, self.options.id_dtype):
            return batch_decoded(self.samples, self.options)
        return self._explained(lambda: _place_batch(self._flat(), self.options))

    def _explained(self, decode: Callable[[], T]) -> T:
        """``decode()``, whose error, where one start was given for requests whose row counts
        imply different ones, says which starts to pass."""
        try:
            return decode()
        except RRError as e:
            if self._given:
                raise  # one start per request was given: the error is about those
            implied = _implied_starts(self._requests, self._starts)
            if len(set(implied)) == 1:  # one start for all: the request's own error says it
                raise
            raise EngineOutputError(
                f"{e}. The requests' row counts say they were sent with different prompt "
                f"starts (routed_experts_prompt_start {implied}, one per request), not "
                f"{self._starts[0]} for all: pass prompt_starts={implied} (one per request, in "
                "request_outputs order)"
            ) from e


#: The options :func:`decode_vllm_output` reads.
READS = frozenset(
    {"prompt_start", "on_abort", "engine_config"}
    | {"allow_all_zero", "allow_physical", "logical_experts", "validate"}
)


def decode_vllm_output(
    request_outputs: Any,
    options: DecodeOptions | RouteMeta,
    /,
    *,
    prompt_starts: Sequence[int] | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of every completion of one vLLM ``RequestOutput`` or a list of them (real or
    duck-typed, any era), request-major, as :class:`~rr_vllm.DecodedRoutes`: index it for a
    sample, ``.to_batch()`` for the validated :class:`~rr_core.RouteBatch` (one copy of each
    engine array where its dtype is the batch's).

    Options: ``prompt_start``, the ``SamplingParams.routed_experts_prompt_start`` the requests
    were sent with (0.22+), ``on_abort``, ``engine_config``, and the batch checks.
    ``prompt_starts``: one start per request instead, in ``request_outputs`` order (a rollout's
    multi-turn continuations and fresh prompts differ). The meta is on the all_layers axis; its
    ``moe_layer_numbers`` re-expand 0.21's MoE-only arrays. A missing or mistyped field raises
    :class:`~rr_vllm.EngineOutputError` here; a row count or shape that does not fit, when the
    samples are first read or batched.

    The form that predates :class:`~rr_vllm.DecodeOptions` (a RouteMeta, option keywords; one
    ``RequestOutput``) returns a list of samples, with a DeprecationWarning.
    """
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_vllm_output")
    if legacy:  # the list of samples of one request it always returned
        request = read_request(request_outputs)
        return [  # type: ignore[return-value]  # the deprecated form's list
            decode_completion(request, c, opts, prompt_start=opts.prompt_start)
            for c in request.completions
        ]
    return _decode(request_outputs, opts, prompt_starts)


def _decode(request_outputs: Any, opts: DecodeOptions, per_request: Any) -> VllmRoutes:
    outputs = _requests(request_outputs)
    given = per_request is not None
    starts = _prompt_starts(per_request if given else opts.prompt_start, len(outputs))
    return VllmRoutes([read_request(r) for r in outputs], starts, opts, given)


class BatchKeywords(TypedDict, total=False):
    """The options the deprecated :func:`decode_vllm_batch` reads, with ``prompt_start`` also
    one value per request."""

    prompt_start: int | Sequence[int]
    allow_all_zero: bool
    allow_physical: bool
    logical_experts: int | None
    validate: bool
    engine_config: EngineConfig | None


def decode_vllm_batch(
    request_outputs: Sequence[Any],
    options: RouteMeta | DecodeOptions,
    /,
    **keywords: Unpack[BatchKeywords],
) -> RouteBatch:
    """Deprecated: ``decode_vllm_output(request_outputs, options,
    prompt_starts=...).to_batch()``, the same batch, the same one copy."""
    warnings.warn(
        "decode_vllm_batch(outputs, meta, **options) is deprecated and goes in the next release:"
        " decode_vllm_output(outputs, DecodeOptions(meta=meta, ...), prompt_starts=...)"
        ".to_batch() gives the same batch",
        DeprecationWarning,
        stacklevel=2,
    )
    per_request = keywords.get("prompt_start")
    single = {k: v for k, v in keywords.items() if k != "prompt_start" or isinstance(v, int)}
    opts = decode_options(options, single, reads=READS - {"on_abort"}, decoder="decode_vllm_batch")
    if opts.on_abort != "mask":
        raise EngineOutputError(
            f"decode_vllm_batch masks aborted requests (their tokens stay in the batch); got "
            f"on_abort={opts.on_abort!r}: decode with decode_vllm_output to drop them"
        )
    if isinstance(request_outputs, str | bytes | Mapping) or not isinstance(
        request_outputs, Sequence
    ):
        raise EngineOutputError(
            f"request_outputs must be a list of RequestOutput; got {type(request_outputs).__name__}"
        )
    starts = None if per_request is None or isinstance(per_request, int) else per_request
    return _decode(request_outputs, opts, starts).to_batch()


def _direct(requests: Sequence[Request], dtype: np.dtype[Any]) -> bool:
    """Whether every completion's rows can be copied into the batch as they are: one array per
    completion (not vLLM 0.21's split arrays) already in the batch's dtype (narrowing waits for
    rr_core's range check)."""
    for r in requests:
        if r.split:
            return False
        for c in r.completions:
            rows_dtype = getattr(c.rows, "dtype", None)
            if c.finish_reason not in ABORT_REASONS and not (
                isinstance(rows_dtype, np.dtype) and rows_dtype == dtype
            ):
                return False
    return True


def _place_batch(flat: list[tuple[Request, Completion, int]], opts: DecodeOptions) -> RouteBatch:
    """Each completion's rows copied once, into their place in one recycled batch buffer."""
    meta, dtype = opts.meta, opts.id_dtype
    lengths = [r.num_prompt_tokens + c.num_generated_tokens for r, c, _ in flat]
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


def _prompt_starts(prompt_start: object, num_requests: int) -> list[int]:
    """One ``prompt_start`` per request: the value given for all, or the sequence given."""
    if isinstance(prompt_start, int) and not isinstance(prompt_start, bool):
        return [prompt_start] * num_requests
    if isinstance(prompt_start, str | bytes) or not isinstance(prompt_start, Sequence):
        raise EngineOutputError(
            f"prompt_starts must be one int per request; got {type(prompt_start).__name__}"
        )
    starts = list(prompt_start)
    if len(starts) != num_requests:
        raise EngineOutputError(
            f"prompt_starts has {len(starts)} values for {num_requests} requests; pass one per "
            "request (in request_outputs order), or one prompt_start for all in the options"
        )
    for i, start in enumerate(starts):
        if not isinstance(start, int) or isinstance(start, bool):
            raise EngineOutputError(
                f"prompt_starts[{i}] must be an int; got {type(start).__name__}"
            )
    return [count(start, f"prompt_starts[{i}]") for i, start in enumerate(starts)]
