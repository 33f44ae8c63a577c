"""A router call in REPLAY mode: the armed ids on the replayed rows, the native top-k on the
others, and the call's agreement counted.

Shapes: T rows the router sees, E experts, K top-k.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import numpy as np
import torch

from rr_core.errors import ReplayError
from rr_core.replay import agreement_numba, replay_numba
from rr_core.replay.armed import Armed
from rr_core.replay.checks import unchecked_ids_error
from rr_core.replay.tally import Agreement
from rr_core.replay.topk import (
    TopK,
    check_real_scores,
    checked_values,
    in_score_order_T,
    native_ids,
    replay_checked,
    same_sets_T,
    topk_set_and_order_T,
)

#: Per thread: whether the latest replaying router call replayed ids armed with validate=False.
_LATEST = threading.local()


def replayed_unchecked_ids() -> bool:
    """Whether the latest replaying router call on this thread replayed targets armed with
    ``validate=False`` (ids never checked for range or repeats). Checked targets hold K distinct
    ids per replayed row and native rows come from a top-k, so an adapter that sizes buffers as
    K per row needs to count the routing map only after a call for which this is True."""
    return bool(getattr(_LATEST, "unchecked", False))


def note_nothing_armed() -> None:
    """A replaying call found nothing armed: it replays no unchecked ids."""
    _LATEST.unchecked = False


def replay_call(
    index: int,
    layer: int,
    microbatch: Hashable,
    backward: bool,
    scores_TE: torch.Tensor,
    values_TE: torch.Tensor | None,
    rows: int,
    armed: Armed,
    agreement: Agreement | None,
    exact: bool,
    num_experts: int,
    top_k: int,
) -> TopK:
    """Router ``index`` (on ``layer``) replays ``armed`` over the ``rows`` rows of its scores;
    ``agreement`` (None: not measured) counts a forward call's rows, by a second top-k where
    ``exact``. (Positional arguments, in this order: a router call passes them without building
    keywords, and ``rows`` as it read them: each tensor attribute read is a call.)"""
    _LATEST.unchecked = not armed.validated
    if armed.rows != rows:
        raise ReplayError(
            f"layer {layer}, micro-batch {microbatch!r}: router sees {rows} "
            f"tokens but {armed.rows} rows are armed; arm rows in the router's "
            "token order (after sequence-parallel scatter, context-parallel split, packing)"
        )
    exact = exact and not backward
    # the controller checked the scores' shape and k; arming the targets' dtype and shape and
    # the mask: only the scores' dtype is left to check here
    dtype, device = check_real_scores(scores_TE), scores_TE.device
    on_host = not exact and agreement_numba.runs_on(device, dtype)
    host_ids = armed.host_ids if on_host else None
    counting = None if backward else agreement
    if host_ids is not None:
        return _replay_on_host(
            index, armed, backward, scores_TE, values_TE, host_ids, counting, top_k
        )
    target_TK = armed.target_TK(index)
    native_TK = native_ids(scores_TE, top_k) if exact else None
    try:
        out = replay_checked(
            scores_TE,
            top_k,
            target_TK,
            armed.mask_T,
            values_TE,
            native_TK,
            armed.native_rows,
            device,
        )
    except (IndexError, RuntimeError) as e:  # only unchecked (validate=False) ids get here
        bad = unchecked_ids_error(target_TK, armed.mask_T, num_experts)
        if bad is None:
            raise
        raise ReplayError(f"layer {layer}, micro-batch {microbatch!r}: {bad}") from e
    if backward:
        return out
    armed.consumed[index] = True
    if counting is None:
        return out
    if native_TK is None and on_host:  # the gather took the ids: all in range
        counting.count_on_host(
            index,
            armed.replayed_rows,
            scores_TE.detach().numpy(),
            out.ids_TK.numpy(),
            armed.mask_numpy,
        )
        return out
    if native_TK is not None:
        agree_T = same_sets_T(out.ids_TK, native_TK)
        in_order_T = in_score_order_T(scores_TE, out.ids_TK)
    else:
        agree_T, in_order_T = topk_set_and_order_T(scores_TE, out.ids_TK)
    if armed.mask_T is not None:
        agree_T &= armed.mask_T.to(agree_T.device, non_blocking=True)
    counting.add(index, agree_T, in_order_T, armed.replayed_rows)
    return out


def _replay_on_host(
    index: int,
    armed: Armed,
    backward: bool,
    scores_TE: torch.Tensor,
    values_TE: torch.Tensor | None,
    host_ids: tuple[np.ndarray, np.ndarray | None],
    agreement: Agreement | None,
    top_k: int,
) -> TopK:
    """A replaying call on the CPU: the ids from one compiled pass (armed ids, R3's native
    rows ranked), one gather for the values, the agreement counted on the host."""
    scores_np = scores_TE.detach().numpy()
    routes_RLK, rows_T = host_ids
    mask_T = armed.mask_numpy
    ids_np = replay_numba.replay_ids_cpu(
        scores_np, routes_RLK, armed.slot_of_router[index], rows_T, mask_T, top_k
    )
    ids_TK = torch.from_numpy(ids_np)
    source_TE = scores_TE if values_TE is None else checked_values(values_TE, scores_TE)
    out = TopK(source_TE.gather(-1, ids_TK), ids_TK)
    if not backward:
        armed.consumed[index] = True
        if agreement is not None:
            agreement.count_on_host(index, armed.replayed_rows, scores_np, ids_np, mask_T)
    return out
