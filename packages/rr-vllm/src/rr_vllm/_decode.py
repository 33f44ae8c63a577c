"""Decoding the routed experts that vLLM and SGLang return into per-sample routes.

Shape legend: T tokens of a sample (prompt + generated), N rows the engine returned, L layer slots
on rr_core's ``all_layers`` axis, M MoE slots, K top-k, P prompt tokens, G generated tokens.

Row ``i`` of an engine array is token ``prompt_start + i``, routed when that token was the input;
the last sampled token has no row (``vllm-facts.md``). Every era comes out the same way: a
:class:`SampleRoutes` whose ``routes_TLK`` holds the rows at their token positions (zeros
elsewhere) and whose ``valid_T`` marks the rows that carry a route. Placing the rows is the one
copy of the payload; read-only and non-contiguous inputs are never written to.

Formats:

- vLLM 0.14-0.20, 0.22-0.31, 0.32+: ``CompletionOutput.routed_experts`` ``[N, L, K]`` (int32, or
  uint8 / uint16 from 0.22) with ``N = T - 1 - prompt_start``;
- vLLM 0.21: ``RequestOutput.prompt_routed_experts`` ``[P, M, K]`` plus the generation rows
  ``CompletionOutput.routed_experts`` ``[G-1, M, K]`` (int16, MoE layers only); rows of -1 were
  served from the prefix cache and become invalid rows; both are None after preemption;
- the wire forms (vLLM's HTTP base64 ``.npy``, SGLang's ``meta_info``) are read in
  :mod:`rr_vllm._wire` and placed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from rr_core import RouteMeta, narrowest_dtype
from rr_vllm._errors import EngineOutputError
from rr_vllm._fields import attr, count, reason, token_count
from rr_vllm._validate import check_missing, check_row_count, is_aborted

AbortPolicy = Literal["mask", "drop"]
IntArray = npt.NDArray[np.integer[Any]]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, kw_only=True, eq=False)
class SampleRoutes:
    """Routes of one sample on the ``all_layers`` axis.

    ``routes_TLK`` has a row for every token (zeros where ``valid_T`` is False: before
    ``prompt_start``, the last sampled token, prefix-cached rows of vLLM 0.21, every row of a
    masked aborted request). Its dtype is the engine's.
    """

    routes_TLK: IntArray
    valid_T: BoolArray
    num_prompt_tokens: int
    prompt_start: int
    finish_reason: str | None

    @property
    def aborted(self) -> bool:
        return is_aborted(self.finish_reason)


def _compact_dtype(num_experts: int) -> np.dtype[Any]:
    """:func:`rr_core.narrowest_dtype` as a numpy dtype (the engine arrays are numpy)."""
    return np.dtype(str(narrowest_dtype(num_experts)).removeprefix("torch."))


def as_rows(value: Any, what: str) -> IntArray:
    """A numpy view of an engine's routes (numpy, or a CPU torch tensor), checked to be 3-D
    integer data; nothing is copied."""
    expected = f"{what} must be an integer [rows, layers, top_k] array"
    try:
        if not isinstance(value, np.ndarray) and hasattr(value, "numpy"):
            value = value.detach().cpu().numpy() if hasattr(value, "detach") else value.numpy()
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        # a bf16 tensor, a ragged list: numpy cannot read it as one array
        raise EngineOutputError(
            f"{expected}; got a {type(value).__name__} numpy cannot read ({e})"
        ) from e
    if array.ndim != 3 or array.dtype.kind not in "iu":
        raise EngineOutputError(f"{expected}; got dtype {array.dtype}, shape {array.shape}")
    return array


def _masked(meta: RouteMeta, p: int, t: int, prompt_start: int, reason: str | None) -> SampleRoutes:
    L, K = len(meta.layer_numbers), meta.top_k
    return SampleRoutes(
        routes_TLK=np.zeros((t, L, K), dtype=_compact_dtype(meta.num_experts)),
        valid_T=np.zeros(t, dtype=bool),
        num_prompt_tokens=p,
        prompt_start=prompt_start,
        finish_reason=reason,
    )


def place_rows(
    blocks: Sequence[IntArray],
    meta: RouteMeta,
    *,
    moe_only: bool,
    num_prompt_tokens: int,
    num_tokens: int,
    prompt_start: int,
    finish_reason: str | None,
    what: str,
    out: tuple[IntArray, BoolArray] | None = None,
) -> SampleRoutes:
    """Lay consecutive row blocks out at their token positions (the one copy), into fresh arrays
    or into ``out`` (``[T, L, K]`` routes of the blocks' dtype and ``[T]`` validity, any
    contents: the rows no block covers are zeroed)."""
    L, K = len(meta.layer_numbers), meta.top_k
    slots = list(meta.moe_slots)
    width = len(slots) if moe_only else L
    for b in blocks:
        if b.shape[1:] != (width, K):
            axis = f"{width} MoE layers" if moe_only else f"all {L} decoder layers"
            raise EngineOutputError(
                f"{what}: routes have shape {b.shape}; expected [rows, {width}, {K}] ({axis}, "
                f"top_k={K} from the meta); wrong model config, or an array of another era"
            )
    n = sum(b.shape[0] for b in blocks)
    check_row_count(n, num_tokens, prompt_start)
    dtype = np.result_type(*blocks) if blocks else _compact_dtype(meta.num_experts)
    if dtype.kind not in "iu":  # uint64 with a signed block promotes to float64
        raise EngineOutputError(
            f"{what}: route blocks of dtypes {[str(b.dtype) for b in blocks]} have no common "
            "integer dtype; an engine returns one integer dtype per request"
        )
    if out is None:
        out = np.zeros((num_tokens, L, K), dtype=dtype), np.zeros(num_tokens, dtype=bool)
    else:  # any contents: zero what the blocks leave (MoE-only blocks leave the dense slots)
        out[0][: prompt_start + n if moe_only else prompt_start] = 0
        out[0][prompt_start + n :] = 0
        out[1][:] = False
    routes_TLK, valid_T = out
    row = prompt_start
    for b in blocks:
        rows = slice(row, row + b.shape[0])
        if moe_only:
            routes_TLK[rows, slots] = b
        else:
            routes_TLK[rows] = b
        valid_T[rows] = True
        if moe_only and dtype.kind == "i" and b.size:
            cached_R = (b == -1).all(axis=(1, 2))  # 0.21: served from the prefix cache
            valid_T[rows][cached_R] = False
            routes_TLK[rows][cached_R] = 0
        row += b.shape[0]
    return SampleRoutes(
        routes_TLK=routes_TLK,
        valid_T=valid_T,
        num_prompt_tokens=num_prompt_tokens,
        prompt_start=prompt_start,
        finish_reason=finish_reason,
    )


def check_policy(on_abort: str) -> None:
    if not isinstance(on_abort, str) or on_abort not in ("mask", "drop"):
        raise EngineOutputError(f"on_abort must be 'mask' or 'drop'; got {on_abort!r}")


def decode_routes_array(
    routes: Any,
    meta: RouteMeta,
    *,
    num_prompt_tokens: int,
    num_generated_tokens: int,
    prompt_start: int = 0,
    finish_reason: str | None = None,
    on_abort: AbortPolicy = "mask",
    what: str = "routes",
    out: tuple[IntArray, BoolArray] | None = None,
) -> SampleRoutes | None:
    """One all-layers ``[N, L, K]`` array (or None) of a sample with P prompt and G generated
    tokens. An aborted sample (``finish_reason == "abort"``) is masked (every row invalid) or
    dropped (None); otherwise None routes raise (D3). ``out``: see :func:`place_rows` (a masked
    sample zeroes it)."""
    check_policy(on_abort)
    p = count(num_prompt_tokens, f"{what}: num_prompt_tokens")
    t = p + count(num_generated_tokens, f"{what}: num_generated_tokens")
    prompt_start = count(prompt_start, f"{what}: prompt_start")
    finish_reason = reason(finish_reason, f"{what}: finish_reason")
    if is_aborted(finish_reason):
        if out is not None:
            out[0][:] = 0
            out[1][:] = False
        return None if on_abort == "drop" else _masked(meta, p, t, prompt_start, finish_reason)
    if routes is None:
        check_missing(what, finish_reason)
    return place_rows(
        [as_rows(routes, what)],
        meta,
        moe_only=False,
        num_prompt_tokens=p,
        num_tokens=t,
        prompt_start=prompt_start,
        finish_reason=finish_reason,
        what=what,
        out=out,
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
    return Request(request_id, p, split, prompt_rows, completions)


def decode_vllm_output(
    request_output: Any,
    meta: RouteMeta,
    *,
    prompt_start: int = 0,
    on_abort: AbortPolicy = "mask",
) -> list[SampleRoutes | None]:
    """Routes of each completion of a vLLM ``RequestOutput`` (real or duck-typed, any era).

    ``prompt_start`` is the ``SamplingParams.routed_experts_prompt_start`` the request was sent
    with (0.22+). ``meta`` is on the all_layers axis; its ``moe_layer_numbers`` re-expand 0.21's
    MoE-only arrays. A missing or mistyped field raises :class:`~rr_vllm.EngineOutputError`.
    """
    check_policy(on_abort)
    request = read_request(request_output)
    p, split = request.num_prompt_tokens, request.split
    if split and prompt_start:
        raise EngineOutputError(
            f"request {request.request_id}: prompt_start={prompt_start}, but vLLM 0.21 has no "
            "routed_experts_prompt_start (it arrived in 0.22); pass prompt_start=0"
        )
    out: list[SampleRoutes | None] = []
    for c in request.completions:
        what, g, reason_ = c.what, c.num_generated_tokens, c.finish_reason
        if not split or is_aborted(reason_):
            out.append(
                decode_routes_array(
                    c.rows,
                    meta,
                    num_prompt_tokens=p,
                    num_generated_tokens=g,
                    prompt_start=prompt_start,
                    finish_reason=reason_,
                    on_abort=on_abort,
                    what=what,
                )
            )
            continue
        prompt_rows, gen_rows = request.prompt_rows, c.rows
        if prompt_rows is None or gen_rows is None:
            raise EngineOutputError(
                f"{what}: vLLM 0.21 returned None for "
                f"{'prompt_routed_experts' if prompt_rows is None else 'routed_experts'} of a "
                f"request that finished with finish_reason={reason_!r}. 0.21 drops the routes of "
                "a preempted request (or capture is off): resubmit it, avoid preemption (more "
                "KV-cache memory, fewer concurrent sequences), or upgrade to vLLM >= 0.22"
            )
        out.append(
            place_rows(
                [as_rows(prompt_rows, f"{what} prompt"), as_rows(gen_rows, what)],
                meta,
                moe_only=True,
                num_prompt_tokens=p,
                num_tokens=p + g,
                prompt_start=0,
                finish_reason=reason_,
                what=what,
            )
        )
    return out
