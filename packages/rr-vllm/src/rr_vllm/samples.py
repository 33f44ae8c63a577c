"""Per-sample routes: every engine's rows laid out at their token positions (the one copy).

Shape legend: T tokens of a sample (prompt + generated), N rows the engine returned, L layer slots
on rr_core's ``all_layers`` axis, M MoE slots, K top-k, P prompt tokens, G generated tokens.

Row ``i`` of an engine array is token ``prompt_start + i``, routed when that token was the input;
the last sampled token has no row (``vllm-facts.md``). Every era comes out the same way: a
:class:`SampleRoutes` whose ``routes_TLK`` holds the rows at their token positions (zeros
elsewhere) and whose ``valid_T`` marks the rows that carry a route. Placing the rows is the one
copy of the payload; read-only and non-contiguous inputs are never written to.

Formats:

- vLLM 0.14-0.20, 0.22-0.31, 0.32+: ``CompletionOutput.routed_experts`` ``[N, L, K]`` (int32, or
  uint8 / uint16 from 0.22) with ``N = T - 1 - prompt_start`` (rr_core's
  :func:`~rr_core.expected_route_rows`, checked by :func:`~rr_core.check_route_rows`);
- vLLM 0.21: ``RequestOutput.prompt_routed_experts`` ``[P, M, K]`` plus the generation rows
  ``CompletionOutput.routed_experts`` ``[G-1, M, K]`` (int16, MoE layers only); rows of -1 were
  served from the prefix cache and become invalid rows; both are None after preemption;
- the wire forms (vLLM's HTTP base64 ``.npy``, SGLang's ``meta_info``) are read in each engine's
  ``wire`` module and placed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from rr_core import RRError
from rr_core.checks import check_instance, check_sequence
from rr_core.routes.rows import check_route_rows
from rr_vllm.engine_config import check_split_rows
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import count, reason
from rr_vllm.options import DecodeOptions

IntArray = npt.NDArray[np.integer[Any]]
BoolArray = npt.NDArray[np.bool_]

#: ``finish_reason`` values of a request that did not finish normally.
ABORT_REASONS = frozenset({"abort"})


def is_aborted(finish_reason: str | None) -> bool:
    return isinstance(finish_reason, str) and finish_reason in ABORT_REASONS


def check_missing(what: str, finish_reason: str | None) -> None:
    """Routes are None on a sample that was not aborted: an unfinished output (vLLM attaches
    the routes to a request's final output only), or D3 for a finished one."""
    if is_aborted(finish_reason):
        return
    if finish_reason is None:
        raise EngineOutputError(
            f"{what}: the request has not finished (finish_reason=None), so its routed experts "
            "are None: vLLM attaches the routes to a request's final output only, and this "
            "output is an earlier one (read before the request's last step, or left by an "
            "offline LLMEngine.abort_request, which sends no final output). Decode the final "
            "output, or resubmit the request; see `rr explain D3`"
        )
    raise EngineOutputError(
        f"{what}: routed experts are None for a request that finished with "
        f"finish_reason={finish_reason!r} (D3); capture is off on the engine "
        "(enable_return_routed_experts / --enable-return-routed-experts, SGLang also needs "
        "return_routed_experts=true per request); see `rr explain D3`"
    )


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


def check_sample(
    value: object, what: str, error: type[RRError] = EngineOutputError
) -> SampleRoutes:
    """``value`` if it is a :class:`SampleRoutes` (what every decoder returns), else ``error``."""
    return check_instance(
        value, SampleRoutes, error, f"{what} must be a SampleRoutes (decode first)"
    )


def check_samples(
    value: object, what: str, error: type[RRError] = EngineOutputError
) -> list[SampleRoutes | None]:
    """A list of :class:`SampleRoutes` or None (a dropped aborted request), else ``error``."""
    return check_sequence(value, what, error, of=(SampleRoutes, type(None)))


class Sample(NamedTuple):
    """One sample as its answer states it: its name in errors, P prompt and T tokens, the token
    its rows start at, and how it ended. Every decoder builds one per sample and hands it, with
    the :class:`~rr_vllm.DecodeOptions`, to :func:`decode_rows` or :func:`place_rows`.
    ``prefill``: the answer says a prefill replica of a split ran the prompt (D8)."""

    what: str
    num_prompt_tokens: int
    num_tokens: int
    prompt_start: int
    finish_reason: str | None
    prefill: bool = False

    @property
    def aborted(self) -> bool:
        return is_aborted(self.finish_reason)


def sample_of(
    what: str,
    num_prompt_tokens: Any,
    num_generated_tokens: Any,
    *,
    prompt_start: int = 0,
    finish_reason: Any = None,
) -> Sample:
    """A :class:`Sample` of counts read from outside data, each checked."""
    p = count(num_prompt_tokens, f"{what}: num_prompt_tokens")
    t = p + count(num_generated_tokens, f"{what}: num_generated_tokens")
    return Sample(what, p, t, prompt_start, reason(finish_reason, f"{what}: finish_reason"))


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


def unrouted(
    sample: Sample, options: DecodeOptions, out: tuple[IntArray, BoolArray] | None = None
) -> SampleRoutes | None:
    """An aborted sample: dropped (None) or masked (every row invalid; ``out`` is zeroed)."""
    if out is not None:
        out[0][:] = 0
        out[1][:] = False
    if options.on_abort == "drop":
        return None
    t = sample.num_tokens
    return SampleRoutes(
        routes_TLK=np.zeros((t, options.layer_slots, options.top_k), dtype=options.id_dtype),
        valid_T=np.zeros(t, dtype=bool),
        num_prompt_tokens=sample.num_prompt_tokens,
        prompt_start=sample.prompt_start,
        finish_reason=sample.finish_reason,
    )


def place_rows(
    blocks: Sequence[IntArray],
    sample: Sample,
    options: DecodeOptions,
    *,
    moe_only: bool = False,
    out: tuple[IntArray, BoolArray] | None = None,
) -> SampleRoutes:
    """Lay consecutive row blocks out at their token positions from ``sample.prompt_start``
    (the one copy), into fresh arrays or into ``out`` (``[T, L, K]`` routes of the blocks' dtype
    and ``[T]`` validity, any contents: the rows no block covers are zeroed). The row count is
    rr_core's :func:`~rr_core.check_route_rows`; ``moe_only`` blocks fill the MoE slots."""
    what, num_tokens, prompt_start = sample.what, sample.num_tokens, sample.prompt_start
    L, K = options.layer_slots, options.top_k
    slots = options.moe_slots
    width = len(slots) if moe_only else L
    for b in blocks:
        if b.shape[1:] != (width, K):
            axis = f"{width} MoE layers" if moe_only else f"all {L} decoder layers"
            raise EngineOutputError(
                f"{what}: routes have shape {b.shape}; expected [rows, {width}, {K}] ({axis}, "
                f"top_k={K} from the meta); wrong model config, or an array of another era"
            )
    n = sum(b.shape[0] for b in blocks)
    check_route_rows(n, num_tokens, prompt_start=prompt_start)
    p = sample.num_prompt_tokens
    check_split_rows(options.engine_config, what, prompt_start, p, prefill=sample.prefill)
    dtype = np.result_type(*blocks) if blocks else options.id_dtype
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
        num_prompt_tokens=sample.num_prompt_tokens,
        prompt_start=prompt_start,
        finish_reason=sample.finish_reason,
    )


def decode_rows(
    routes: Any,
    sample: Sample,
    options: DecodeOptions,
    *,
    out: tuple[IntArray, BoolArray] | None = None,
) -> SampleRoutes | None:
    """One all-layers ``[N, L, K]`` array (or None) of ``sample``: masked or dropped when the
    sample was aborted, refused when a finished sample has none (D3), else placed."""
    if sample.aborted:
        return unrouted(sample, options, out)
    if routes is None:
        check_missing(sample.what, sample.finish_reason)
    return place_rows([as_rows(routes, sample.what)], sample, options, out=out)
