"""``replay_topk``: the top-k step of a router, with forced expert ids.

Shapes: T tokens, E experts, K top-k.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rr_core.errors import ReplayError
from rr_core.replay.agreement_numba import topk_set_and_order_cpu
from rr_core.routes.args import as_index


class TopK(NamedTuple):
    """What a router's top-k step yields: the values it keeps and the expert ids they belong to."""

    values_TK: torch.Tensor
    ids_TK: torch.Tensor


def native_topk(scores_TE: torch.Tensor, k: int, *, values_TE: torch.Tensor | None = None) -> TopK:
    """Plain top-k over ``scores_TE``; values come from ``values_TE`` when given (a router that
    selects on biased scores but weights with unbiased ones)."""
    k = _check_scores(scores_TE, k)
    selected, ids_TK = torch.topk(scores_TE, k, dim=-1)
    if values_TE is None:
        return TopK(selected, ids_TK)
    return TopK(checked_values(values_TE, scores_TE).gather(-1, ids_TK), ids_TK)


def native_ids(scores_TE: torch.Tensor, k: int) -> torch.Tensor:
    """The native top-k ids, off the autograd graph: ids carry no gradient, and a recompute
    that skips this call must save the same tensors as the forward that made it."""
    # detach, not a no_grad block: the same top-k without entering and leaving a grad mode
    return torch.topk(scores_TE.detach(), k, dim=-1).indices


def replay_topk(
    scores_TE: torch.Tensor,
    k: int,
    *,
    target_ids_TK: torch.Tensor | None = None,
    replay_mask_T: torch.Tensor | None = None,
    values_TE: torch.Tensor | None = None,
    native_ids_TK: torch.Tensor | None = None,
    native_rows_N: torch.Tensor | None = None,
) -> TopK:
    """Top-k where rows of ``replay_mask_T`` (all rows when it is None) use ``target_ids_TK``.

    Values are gathered from the router's own unmasked scores at the replayed ids, so the
    gradient reaches every replayed expert, also those the native top-k would not pick (B4).
    Replayed rows cost a gather, not a top-k: rows outside the mask get a native top-k over
    those rows only (R3 leaves one row per sequence native), then one gather takes the values
    of every row, which makes replay cheaper than routing. ``native_rows_N`` (the rows outside
    the mask, ``(~replay_mask_T).nonzero()``) saves finding them when the caller knows them
    (the controller finds them once per micro-batch: on an accelerator that is a host sync);
    ``native_ids_TK`` saves the top-k when the caller already computed it for every row. Ids
    are checked by the caller (the controller validates them once per micro-batch).
    """
    if target_ids_TK is None:
        return native_topk(scores_TE, k, values_TE=values_TE)
    k = _check_scores(scores_TE, k, rows=True)
    if not isinstance(target_ids_TK, torch.Tensor) or target_ids_TK.dtype in _NOT_IDS:
        got = getattr(target_ids_TK, "dtype", type(target_ids_TK).__name__)
        raise ReplayError(f"target_ids_TK must be an integer tensor [T, {k}]; got {got}")
    T = scores_TE.shape[0]
    if tuple(target_ids_TK.shape) != (T, k):
        raise ReplayError(
            f"target_ids_TK must have shape [T={T}, k={k}] like scores_TE's rows; got "
            f"{tuple(target_ids_TK.shape)}"
        )
    if replay_mask_T is not None and (
        not isinstance(replay_mask_T, torch.Tensor)
        or replay_mask_T.dtype != torch.bool
        or tuple(replay_mask_T.shape) != (T,)
    ):
        got = getattr(replay_mask_T, "shape", type(replay_mask_T).__name__)
        raise ReplayError(f"replay_mask_T must be a bool tensor [T={T}]; got {got}")
    return replay_checked(
        scores_TE, k, target_ids_TK, replay_mask_T, values_TE, native_ids_TK, native_rows_N
    )


def replay_checked(
    scores_TE: torch.Tensor,
    k: int,
    target_ids_TK: torch.Tensor,
    replay_mask_T: torch.Tensor | None = None,
    values_TE: torch.Tensor | None = None,
    native_ids_TK: torch.Tensor | None = None,
    native_rows_N: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> TopK:
    """:func:`replay_topk` for arguments already checked: scores ``[T, E]`` of real values, an
    int ``k`` in ``[1, E]``, integer ``[T, k]`` targets and a bool ``[T]`` mask. The controller
    checks the scores per call and the targets and mask once, when they are armed; on small
    batches those checks cost as much as the ops themselves. ``device``: the scores' device,
    when the caller has read it already."""
    source_TE = scores_TE if values_TE is None else checked_values(values_TE, scores_TE)
    if device is None:
        device = scores_TE.device
    ids_TK = target_ids_TK
    if ids_TK.dtype is not torch.int64 or ids_TK.device != device:
        ids_TK = ids_TK.to(device=device, dtype=torch.int64, non_blocking=True)
    if replay_mask_T is not None and native_ids_TK is not None:
        mask_T1 = _on(replay_mask_T, device).unsqueeze(-1)
        ids_TK = torch.where(mask_T1, ids_TK, native_ids_TK)
    elif replay_mask_T is not None:
        if native_rows_N is None:
            native_rows_N = (~replay_mask_T).nonzero().flatten()
        if native_rows_N.numel():
            rows_N = _on(native_rows_N, device)
            # off the graph (detached), as native_ids: a recompute saves the same tensors
            native_NK = torch.topk(scores_TE.detach().index_select(0, rows_N), k, dim=-1).indices
            if ids_TK is target_ids_TK:  # the caller's tensor: never written
                ids_TK = ids_TK.index_copy(0, rows_N, native_NK)
            else:  # a fresh copy (widened or moved): fill it in place
                ids_TK.index_copy_(0, rows_N, native_NK)
    return TopK(source_TE.gather(-1, ids_TK), ids_TK)


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    # a .to() that has nothing to do still costs as much as a small op
    return tensor if tensor.device == device else tensor.to(device, non_blocking=True)


def check_real_scores(scores_TE: torch.Tensor) -> torch.dtype:
    """Scores a top-k can rank: not bool, not complex. Returns their dtype."""
    dtype = scores_TE.dtype
    if dtype is torch.bool or dtype.is_complex:
        raise ReplayError(f"scores_TE must hold real scores; got dtype {dtype}")
    return dtype


_NOT_IDS = frozenset({torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64})


def checked_values(values_TE: object, scores_TE: torch.Tensor) -> torch.Tensor:
    """``values_TE`` (the scores a router weights with) when shaped like ``scores_TE``."""
    if not isinstance(values_TE, torch.Tensor) or values_TE.shape != scores_TE.shape:
        got = getattr(values_TE, "shape", type(values_TE).__name__)
        raise ReplayError(f"values_TE must be a tensor shaped like scores_TE; got {got}")
    return values_TE


def _check_scores(scores_TE: torch.Tensor, k: int, *, rows: bool = False) -> int:
    """O(1) checks so that a wrong call fails with its values, not inside torch.topk (``k`` as
    a plain int). Native top-k takes any leading shape (``[..., E]``); replay needs rows
    (``[T, E]``)."""
    if (
        not isinstance(scores_TE, torch.Tensor)
        or scores_TE.dim() < 1
        or (rows and scores_TE.dim() != 2)
    ):
        got = getattr(scores_TE, "shape", type(scores_TE).__name__)
        raise ReplayError(
            f"scores_TE must be a {'[T, E]' if rows else '[..., E]'} tensor; got {got}"
        )
    check_real_scores(scores_TE)
    e, n = scores_TE.shape[-1], as_index(k, "k", ReplayError)
    if not 1 <= n <= e:
        raise ReplayError(f"k must be in [1, E={e}]; got {k!r}")
    return n


def same_sets_T(ids_a_TK: torch.Tensor, ids_b_TK: torch.Tensor) -> torch.Tensor:
    """Per row: do both rows hold the same set of expert ids (order ignored)?"""
    a_TK = ids_a_TK.to(torch.int64).sort(dim=-1).values
    b_TK = ids_b_TK.to(device=a_TK.device, dtype=torch.int64).sort(dim=-1).values
    return (a_TK == b_TK).all(dim=-1)


def in_score_order_T(scores_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    """Per row: are the ids in the order the scores rank them (slot 0 scoring highest; a tie
    either way counts as in order)? The engine's slot order is what anything reading ids by
    position (slot-ordered routing weights, say) relies on."""
    return _in_order_T(_chosen_TK(scores_TE, ids_TK))


def is_topk_set_T(scores_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    """Per row: is ``ids_TK`` (distinct ids) a top-k set of ``scores_TE``, that is, does no
    expert outside it score above its lowest member? The native top-k picks exactly this set
    unless another expert ties that lowest score (then either is a top-k set, and this counts
    the row as agreeing). Two reductions over the scores: no second top-k."""
    ids_TK = _long(ids_TK, scores_TE)
    return _is_topk_set_T(scores_TE.detach(), ids_TK, _chosen_TK(scores_TE, ids_TK))


def topk_set_and_order_T(
    scores_TE: torch.Tensor, ids_TK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`is_topk_set_T` and :func:`in_score_order_T` from one gather of the scores (one
    compiled pass on the CPU where the numba kernels run)."""
    ids_TK = _long(ids_TK, scores_TE)
    fast = topk_set_and_order_cpu(scores_TE, ids_TK)
    if fast is not None:
        return fast
    chosen_TK = _chosen_TK(scores_TE, ids_TK)
    return _is_topk_set_T(scores_TE.detach(), ids_TK, chosen_TK), _in_order_T(chosen_TK)


def _long(ids_TK: torch.Tensor, scores_TE: torch.Tensor) -> torch.Tensor:
    return ids_TK.to(device=scores_TE.device, dtype=torch.int64)


def _chosen_TK(scores_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    # off the graph (detach is cheaper than a no_grad block per call)
    return scores_TE.detach().gather(-1, _long(ids_TK, scores_TE))


def _in_order_T(chosen_TK: torch.Tensor) -> torch.Tensor:
    return (chosen_TK[:, :-1] >= chosen_TK[:, 1:]).all(dim=-1)


def _is_topk_set_T(
    scores_TE: torch.Tensor, ids_TK: torch.Tensor, chosen_TK: torch.Tensor
) -> torch.Tensor:
    # the best score outside the set against the set's lowest (a tie agrees): a scatter and
    # two reductions, where counting the scores above the floor took two compares and two
    # sums (each a cast of the bools)
    outside_T = scores_TE.scatter(-1, ids_TK, float("-inf")).amax(dim=-1)
    return outside_T <= chosen_TK.amin(dim=-1)
