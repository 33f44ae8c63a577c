"""R3 alignment: put engine routes on the trainer's token rows, with a mask of rows to replay.

Shape legend: N rows returned by the engine, T tokens of one sequence, L layer slots, K top-k.
Row t holds the experts chosen when token t was the input. Engines return rows from
``prompt_start`` onwards and none for the last sampled token, which was never fed back (D1; the
count is :mod:`rr_core.routes.rows`); such rows are left to the native router (mask False, ids
zero), never replayed as expert 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rr_core.errors import AlignmentError, RouteValidationError
from rr_core.routes.args import as_index
from rr_core.routes.rows import check_route_rows
from rr_core.routes.validate import ArrayLike, as_int_tensor, is_integer_dtype


def _routes_3d(routes: ArrayLike, what: str) -> torch.Tensor:
    t = as_int_tensor(routes, what)
    if t.dim() != 3:
        raise RouteValidationError(f"{what} must be 3-D [rows, L, K]; got {tuple(t.shape)}")
    return t


def _check_mask(routes_TLK: torch.Tensor, mask_T: torch.Tensor) -> None:
    for name, t in (("routes_TLK", routes_TLK), ("mask_T", mask_T)):
        if not isinstance(t, torch.Tensor):
            raise AlignmentError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if routes_TLK.dim() != 3:
        raise AlignmentError(f"routes_TLK must be 3-D [T, L, K]; got {tuple(routes_TLK.shape)}")
    if mask_T.dtype != torch.bool or tuple(mask_T.shape) != (routes_TLK.shape[0],):
        raise AlignmentError(
            f"mask_T must be bool [T={routes_TLK.shape[0]}] like the routes' rows; got shape "
            f"{tuple(mask_T.shape)}, dtype {mask_T.dtype}"
        )


def align_routes(
    routes_NLK: ArrayLike, num_tokens: int, *, prompt_start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(routes_TLK, replay_mask_T)`` for a sequence of ``num_tokens`` tokens.

    Accepts :func:`~rr_core.expected_route_rows` rows (``T - prompt_start - 1``, the engine's
    contract), or ``T`` rows from ``prompt_start=0`` (a route for every token); rows before
    ``prompt_start`` and a missing last row are invalid. ``T - prompt_start`` rows from
    ``prompt_start > 0`` are refused (G4: a request sent with ``prompt_start - 1``).
    """
    routes = _routes_3d(routes_NLK, "routes_NLK")
    T = as_index(num_tokens, "num_tokens", AlignmentError)
    ps, N = as_index(prompt_start, "prompt_start", AlignmentError), routes.shape[0]
    check_route_rows(N, T, prompt_start=ps)
    _, L, K = routes.shape
    routes_TLK = routes.new_zeros((T, L, K))
    routes_TLK[ps : ps + N] = routes
    mask_T = torch.zeros(T, dtype=torch.bool, device=routes.device)
    mask_T[ps : ps + N] = True
    return routes_TLK, mask_T


def truncate_routes(
    routes_TLK: torch.Tensor, mask_T: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the first ``num_tokens`` rows, for a response truncated after generation (D7)."""
    _check_mask(routes_TLK, mask_T)
    T, n = routes_TLK.shape[0], as_index(num_tokens, "num_tokens", AlignmentError)
    if not 0 <= n <= T:
        raise AlignmentError(
            f"cannot truncate {T} route rows to num_tokens={n}: truncation keeps 0..{T} rows and "
            "never extends; routes for extra tokens must come from the engine"
        )
    return routes_TLK[:n], mask_T[:n]


def pad_rows(
    routes_TLK: torch.Tensor, mask_T: torch.Tensor, multiple: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad at the end to a multiple of ``multiple`` rows (sequence-parallel alignment, D5).

    Real rows keep their positions; padded rows are zero and invalid.
    """
    _check_mask(routes_TLK, mask_T)
    m = as_index(multiple, "multiple", AlignmentError)
    if m < 1:
        raise AlignmentError(f"multiple must be >= 1; got {m}")
    if m >= 2**31:
        raise AlignmentError(f"multiple must be below 2**31 rows; got {m}")
    T, L, K = routes_TLK.shape
    pad = -T % m
    if pad == 0:
        return routes_TLK, mask_T
    routes = torch.cat([routes_TLK, routes_TLK.new_zeros((pad, L, K))])
    return routes, torch.cat([mask_T, mask_T.new_zeros(pad)])


def replay_mask_for_lengths(
    lengths: torch.Tensor | Sequence[int], *, missing_last: bool = True
) -> torch.Tensor:
    """``[N]`` validity of a packed batch of sequences with these lengths; with ``missing_last``
    each non-empty sequence's last row (the last sampled token, D1) is invalid."""
    if isinstance(lengths, torch.Tensor):
        lens = lengths
    elif isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence | np.ndarray):
        raise AlignmentError(
            f"lengths must be a 1-D integer sequence; got {type(lengths).__name__}"
        )
    else:  # an empty list would become float32
        try:
            lens = (
                torch.as_tensor(np.asarray(lengths))
                if len(lengths)
                else torch.zeros(0, dtype=torch.int64)
            )
        except (TypeError, ValueError) as e:
            raise AlignmentError(f"lengths must be a 1-D integer sequence; got {lengths!r}") from e
    if lens.dim() != 1 or not is_integer_dtype(lens.dtype):
        raise AlignmentError(f"lengths must be a 1-D integer sequence; got {lens}")
    lens = lens.to(torch.int64)
    if bool((lens < 0).any()):
        raise AlignmentError(f"lengths must be >= 0; got {lens.tolist()}")
    ends = torch.cumsum(lens, 0)
    mask_N = torch.ones(int(ends[-1]) if lens.numel() else 0, dtype=torch.bool, device=lens.device)
    if missing_last:
        mask_N[ends[lens > 0] - 1] = False
    return mask_N
