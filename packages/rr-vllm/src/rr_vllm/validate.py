"""Checks that catch capture failures in decoded engine routes, on top of rr_core's checks.

Shape legend: T tokens of one sample, N rows the engine returned, L layer slots (all_layers
axis), K top-k. rr_core's :class:`~rr_core.RouteBatch` checks ids in ``[0, E)``, K distinct ids
per valid MoE row, zero dense slots and all-zero MoE slots (E1); this module adds physical-looking
ids (E2). Missing routes (D3) are refused where a sample is decoded (:mod:`rr_vllm.samples`); the
row count is rr_core's :func:`~rr_core.check_route_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rr_core import RouteBatch, RouteMeta, RouteValidationError
from rr_core.checks import check_flag
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import integer
from rr_vllm.samples import (  # the abort and D3 checks read one sample: kept importable here
    ABORT_REASONS as ABORT_REASONS,
)
from rr_vllm.samples import (
    SampleRoutes,
    check_samples,
)
from rr_vllm.samples import (
    check_missing as check_missing,
)
from rr_vllm.samples import (
    is_aborted as is_aborted,
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
