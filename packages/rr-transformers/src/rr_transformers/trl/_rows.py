"""The engine's routes as per-row values of TRL's batch.

TRL keeps a generation batch as a dict of per-row tensors and lists that it shuffles, splits
and buffers row by row (``shuffle_sequence_dict``, ``split_tensor_dict``); a list stored under
:data:`ROUTES_KEY` therefore stays with its rows. Each entry holds one completion's routes (the
engine's T-1 rows for its prompt and completion, all-layers axis) and the token ids they were
captured for, which every arming checks against the row it is laid on: routes moved to another
row raise instead of replaying the wrong tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rr_core import RouteBatch, RouteMeta
from rr_transformers.trl._errors import TrlReplayError

#: The batch key under which the routes ride with their rows.
ROUTES_KEY = "rr_routes"


@dataclass(frozen=True)
class RowRoutes:
    """One row's routes: ``values_TLK`` (``[T-1, L, K]``, all-layers axis), ``valid_T`` and
    the ``token_ids`` (prompt then completion) they were captured for."""

    token_ids: torch.Tensor
    values_TLK: torch.Tensor
    valid_T: torch.Tensor
    meta: RouteMeta


def split_rows(batch: RouteBatch, outputs: Sequence[Any]) -> list[RowRoutes]:
    """Per completion of ``outputs`` (vLLM ``RequestOutput`` s, decoded into ``batch``)."""
    tokens = [
        torch.tensor([*o.prompt_token_ids, *c.token_ids], dtype=torch.int64)
        for o in outputs
        for c in o.outputs
    ]
    rows = []
    for index, token_ids in enumerate(tokens):
        values, valid = batch.sequence(index)
        rows.append(RowRoutes(token_ids, values, valid, batch.meta))
    return rows


def chunk_batch(
    rows: Sequence[RowRoutes], input_ids_BS: torch.Tensor, attention_mask_BS: torch.Tensor
) -> RouteBatch:
    """The routes of a chunk of TRL's rows as one batch for ``arm_routes``: row b's attended
    tokens must be its routes' tokens. A row whose completion TRL masked
    (``mask_truncated_completions``) keeps its prompt rows, none replayed."""
    if len(rows) != input_ids_BS.shape[0]:
        raise TrlReplayError(
            f"the batch has {input_ids_BS.shape[0]} rows and {len(rows)} routes under "
            f"{ROUTES_KEY!r}: a step changed the rows without their routes"
        )
    values, valid = [], []
    for b, row in enumerate(rows):
        attended = input_ids_BS[b][attention_mask_BS[b].bool()].cpu()
        n = attended.shape[0]
        if torch.equal(attended, row.token_ids):
            values.append(row.values_TLK)
            valid.append(row.valid_T)
        elif n < row.token_ids.shape[0] and torch.equal(attended, row.token_ids[:n]):
            values.append(row.values_TLK[:n])  # truncated completion masked: route natively
            valid.append(torch.zeros(min(n, row.values_TLK.shape[0]), dtype=torch.bool))
        else:
            raise TrlReplayError(
                f"row {b} of the forward holds {n} tokens {attended[:8].tolist()}..., its "
                f"routes were captured for {row.token_ids.shape[0]} tokens "
                f"{row.token_ids[:8].tolist()}...: the routes are not this row's"
            )
    meta = rows[0].meta if rows else None
    if meta is None:
        raise TrlReplayError("a forward chunk without rows has no routes to replay")
    return RouteBatch.from_sequences(values, meta, valid=valid, validate=False)
