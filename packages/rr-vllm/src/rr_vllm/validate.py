"""Checks that catch capture failures in decoded engine routes, on top of rr_core's checks.

Shape legend: T tokens of one sample, N rows the engine returned, L layer slots (all_layers
axis), K top-k. rr_core's :class:`~rr_core.RouteBatch` checks ids in ``[0, E)``, K distinct ids
per valid MoE row, zero dense slots and all-zero MoE slots (E1); this module adds physical-looking
ids (E2) and missing routes (D3); the row count is rr_core's :func:`~rr_core.check_route_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rr_core import RouteBatch, RouteMeta, RouteValidationError
from rr_core.checks import check_flag
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import integer

if TYPE_CHECKING:
    from rr_vllm.samples import SampleRoutes

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


def check_logical(
    routes_TLK: np.ndarray,
    valid_T: np.ndarray,
    meta: RouteMeta,
    logical_experts: int,
    *,
    where: str = "sample",
) -> None:
    """E2: ids at or above ``logical_experts`` (the model's logical expert count, when
    ``meta.num_experts`` counts physical slots) look physical."""
    moe = list(meta.moe_slots)
    rows = routes_TLK[valid_T][:, moe]
    bad = rows >= logical_experts
    if bad.any():
        t, j, _ = (int(i) for i in np.argwhere(bad)[0])
        row = int(np.flatnonzero(valid_T)[t])
        layer = meta.layer_numbers[moe[j]]
        raise RouteValidationError(
            f"{where}, token row {row}, layer {layer}: expert ids {rows[t, j].tolist()} reach "
            f"{logical_experts} or more, outside the logical range [0, {logical_experts}); "
            "these look like physical ids from expert-load-balancing (E2, vLLM < 0.16). Use "
            "vLLM >= 0.16, or pass allow_physical=True if the ids are intended; see `rr explain E2`"
        )


def check_all_layers(meta: RouteMeta) -> None:
    if not isinstance(meta, RouteMeta):
        raise RouteValidationError(f"meta must be a RouteMeta; got {type(meta).__name__}")
    if meta.layer_axis != "all_layers":
        raise RouteValidationError(
            f"engine routes are on the all_layers axis; got meta.layer_axis={meta.layer_axis!r}"
        )


def validate_samples(
    samples: Sequence[SampleRoutes | None],
    meta: RouteMeta,
    *,
    allow_all_zero: bool = False,
    allow_physical: bool = False,
    logical_experts: int | None = None,
) -> RouteBatch:
    """A validated all-layers :class:`~rr_core.RouteBatch` of decoded samples (in order).

    Raises :class:`~rr_core.RouteValidationError` naming sample, row and layer for ids outside
    ``[0, E)`` or ``[0, logical_experts)`` (E2, unless ``allow_physical``), repeated ids, non-zero
    dense slots, or a MoE slot that is zero on a whole sequence (E1, unless ``allow_all_zero``).
    """
    return batch_samples(
        samples,
        meta,
        allow_all_zero=allow_all_zero,
        allow_physical=allow_physical,
        logical_experts=logical_experts,
    )


def batch_samples(
    samples: Sequence[SampleRoutes | None],
    meta: RouteMeta,
    *,
    allow_all_zero: bool = False,
    allow_physical: bool = False,
    logical_experts: int | None = None,
    validate: bool = True,
) -> RouteBatch:
    """:func:`validate_samples`; ``validate=False`` skips rr_core's id checks (not E2)."""
    from rr_vllm.samples import check_samples  # rr_vllm.samples imports this module

    check_all_layers(meta)
    for name, flag in (("allow_all_zero", allow_all_zero), ("allow_physical", allow_physical)):
        check_flag(flag, name, EngineOutputError)
    if logical_experts is not None:
        logical_experts = integer(logical_experts, "logical_experts", minimum=1)
    present: list[SampleRoutes] = []
    for i, s in enumerate(check_samples(samples, "samples")):
        if s is None:
            raise EngineOutputError(
                f"sample {i} is None (an aborted request decoded with on_abort='drop'); remove "
                "its tokens from the batch too, or decode with on_abort='mask'"
            )
        present.append(s)
        if logical_experts is not None and not allow_physical:
            check_logical(s.routes_TLK, s.valid_T, meta, logical_experts, where=f"sample {i}")
    return RouteBatch.from_sequences(
        [s.routes_TLK for s in present],
        meta,
        valid=[s.valid_T for s in present],
        validate=validate,
        allow_all_zero=allow_all_zero,
    )
