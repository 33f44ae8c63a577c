"""Checks that catch capture failures in decoded engine routes, on top of rr_core's checks.

Shape legend: T tokens of one sample, N rows the engine returned, L layer slots (all_layers
axis), K top-k. rr_core's :class:`~rr_core.RouteBatch` checks ids in ``[0, E)``, K distinct ids
per valid MoE row, zero dense slots and all-zero MoE slots (E1); this module adds the row count
(D1), physical-looking ids (E2) and missing routes (D3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from rr_core import AlignmentError, RouteBatch, RouteMeta, RouteValidationError, align_routes
from rr_vllm._errors import EngineOutputError

if TYPE_CHECKING:
    from rr_vllm._decode import SampleRoutes

#: ``finish_reason`` values of a request that did not finish normally.
ABORT_REASONS = frozenset({"abort"})


def is_aborted(finish_reason: str | None) -> bool:
    return isinstance(finish_reason, str) and finish_reason in ABORT_REASONS


def check_row_count(num_rows: int, num_tokens: int, prompt_start: int) -> None:
    """The engine returned ``T - prompt_start - 1`` rows (every engine's contract: the last
    sampled token has no row), or ``T`` rows (a route for every token) from ``prompt_start=0``;
    else raise :class:`~rr_core.AlignmentError`.

    With ``prompt_start > 0`` one row more is refused: it is what a decode with
    ``prompt_start=P`` of a request sent with ``P - 1`` (G4) sees, and reading it as one row per
    token would shift every row by one. Other counts raise :func:`~rr_core.align_routes`' error
    (built only then: its tensors cost more than the check on a batch of many samples)."""
    expected = num_tokens - prompt_start - 1
    if 0 <= prompt_start <= num_tokens and num_rows == max(expected, 0):
        return
    if prompt_start == 0 and num_rows == num_tokens:
        return
    if 0 < prompt_start <= num_tokens and num_rows == expected + 1:
        raise AlignmentError(
            f"engine returned N={num_rows} route rows for T={num_tokens} tokens with "
            f"prompt_start={prompt_start}; expected {expected} (T - prompt_start - 1). One row "
            f"more is the answer of a request sent with prompt_start={prompt_start - 1}, as "
            "vllm_sampling_fields sends P - 1 for P on vLLM 0.22-0.29 (G4): decode with the "
            "start that was sent (fields['routed_experts_prompt_start']), then drop the extra "
            "row with drop_rows_before; see `rr explain G4`"
        )
    align_routes(
        torch.empty((num_rows, 0, 0), dtype=torch.int8), num_tokens, prompt_start=prompt_start
    )


def check_missing(what: str, finish_reason: str | None) -> None:
    """D3: a finished, non-aborted request must carry routes."""
    if not is_aborted(finish_reason):
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
    present: list[SampleRoutes] = []
    for i, s in enumerate(samples):
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
