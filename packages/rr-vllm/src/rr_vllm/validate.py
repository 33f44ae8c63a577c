"""Checks that catch capture failures in decoded engine routes, on top of rr_core's checks.

Shape legend: T tokens of one sample, N rows the engine returned, L layer slots (all_layers
axis), K top-k. rr_core's :class:`~rr_core.RouteBatch` checks ids in ``[0, E)``, K distinct ids
per valid MoE row, zero dense slots and all-zero MoE slots (E1); this module adds physical-looking
ids (E2). Missing routes (D3) are refused where a sample is decoded (:mod:`rr_vllm.samples`); the
row count is rr_core's :func:`~rr_core.check_route_rows`. This module reads samples and never
calls back into the decoders: every batch ends in :func:`batch_arrays`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rr_core import RouteBatch, RouteMeta, RouteValidationError
from rr_core.checks import check_flag
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import integer
from rr_vllm.options import DecodeOptions
from rr_vllm.options import check_all_layers as check_all_layers
from rr_vllm.samples import SampleRoutes, check_samples


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


def batch_arrays(
    routes: Sequence[np.ndarray], valid: Sequence[np.ndarray], options: DecodeOptions
) -> RouteBatch:
    """The samples' ``[T, L, K]`` routes and ``[T]`` validity (in order) as one all-layers
    :class:`~rr_core.RouteBatch` under the options' batch checks: E2 here, rr_core's id checks
    unless ``validate=False``. The one batch check every path ends in
    (:class:`~rr_vllm.DecodedRoutes`, :func:`validate_samples`); the options checked their own
    meta and flags."""
    logical_experts = options.logical_experts
    if logical_experts is not None:
        logical_experts = integer(logical_experts, "logical_experts", minimum=1)
        if not options.allow_physical:
            for i, (r, v) in enumerate(zip(routes, valid, strict=True)):
                check_logical(r, v, options.meta, logical_experts, where=f"sample {i}")
    return RouteBatch.from_sequences(
        list(routes),
        options.meta,
        valid=list(valid),
        validate=options.validate,
        allow_all_zero=options.allow_all_zero,
    )


def present(samples: Sequence[SampleRoutes | None]) -> list[SampleRoutes]:
    """Decoded samples (checked to be samples by the caller), none dropped: a None (an aborted
    request decoded with ``on_abort='drop'``) has no tokens to batch."""
    out: list[SampleRoutes] = []
    for i, s in enumerate(samples):
        if s is None:
            raise EngineOutputError(
                f"sample {i} is None (an aborted request decoded with on_abort='drop'); remove "
                "its tokens from the batch too, or decode with on_abort='mask'"
            )
        out.append(s)
    return out


def batch_decoded(samples: Sequence[SampleRoutes | None], options: DecodeOptions) -> RouteBatch:
    """Decoded samples as one batch under the options' batch checks (``DecodedRoutes.to_batch``)."""
    kept = present(samples)
    return batch_arrays([s.routes_TLK for s in kept], [s.valid_T for s in kept], options)


def validate_samples(
    samples: Sequence[SampleRoutes | None],
    meta: RouteMeta,
    *,
    allow_all_zero: bool = False,
    allow_physical: bool = False,
    logical_experts: int | None = None,
    validate: bool = True,
) -> RouteBatch:
    """A validated all-layers :class:`~rr_core.RouteBatch` of decoded samples (in order), for
    samples gathered by hand (resumed, multi-turn, truncated); a decoder's
    :class:`~rr_vllm.DecodedRoutes` does the same with ``.to_batch()``.

    Raises :class:`~rr_core.RouteValidationError` naming sample, row and layer for ids outside
    ``[0, E)`` or ``[0, logical_experts)`` (E2, unless ``allow_physical``), repeated ids, non-zero
    dense slots, or a MoE slot that is zero on a whole sequence (E1, unless ``allow_all_zero``).
    ``validate=False`` skips rr_core's id checks (not E2).
    """
    check_all_layers(meta)
    kept = present(check_samples(samples, "samples"))
    for name, flag in (("allow_all_zero", allow_all_zero), ("allow_physical", allow_physical)):
        check_flag(flag, name, EngineOutputError)
    if logical_experts is not None:
        logical_experts = integer(logical_experts, "logical_experts", minimum=1)
    checks = DecodeOptions(
        meta=meta,
        allow_all_zero=allow_all_zero,
        allow_physical=allow_physical,
        logical_experts=logical_experts,
        validate=validate,
    )
    return batch_arrays([s.routes_TLK for s in kept], [s.valid_T for s in kept], checks)


#: The name :func:`validate_samples` had with ``validate=``.
batch_samples = validate_samples
