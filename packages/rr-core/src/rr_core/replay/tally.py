"""The step's agreement counts, summed lazily: a router call keeps its per-row test results
(two bool tensors) and adds no reduction of its own; reading the counts sums every pending call
of every router in one pass per device. On a CPU the op count, not the data, is what a router
call pays for; on an accelerator each op is a launch. Where the compiled CPU pass runs
(:mod:`rr_core.replay.agreement_numba`) a call adds its counts on the host instead, in
``Tally.counted``, and keeps nothing pending. :class:`Agreement` holds a step's tallies.

Shapes: T rows of one call, N rows of all pending calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from rr_core.replay import agreement_numba

#: Pending rows (all routers) past which the counts are summed at once, so a step of many
#: micro-batches keeps no more than this many test results alive (two bytes a row).
MAX_PENDING_ROWS = 1 << 24


@dataclass
class Tally:
    """One router's agreement this step: rows replayed, the calls not yet summed (the set test
    per row, masked rows False, and the score-order test), the ``[set, order]`` counts of the
    calls summed so far and those the compiled pass counted on the host."""

    rows: int = 0
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    hits: torch.Tensor | None = None
    counted: np.ndarray = field(default_factory=lambda: np.zeros(2, dtype=np.int64))

    def add(self, agree_T: torch.Tensor, in_order_T: torch.Tensor, rows: int) -> int:
        """Keep one call's results; returns its row count."""
        self.pending.append((agree_T, in_order_T))
        self.rows += rows
        return int(agree_T.numel())

    def count(self, column: int) -> int:
        """The ``[set, order]`` count ``column`` of the calls summed (see :func:`settle`)."""
        summed = 0 if self.hits is None else int(self.hits[column])
        return summed + int(self.counted[column])


def settle(tallies: dict[int, Tally]) -> None:
    """Sum every pending call into its tally's counts: per device, one concatenation and one
    cumulative sum cut at the calls' ends, one scatter into the tallies (no host sync)."""
    owners = list(tallies.values())
    calls = [(j, a, o) for j, t in enumerate(owners) for a, o in t.pending]
    by_device = itertools.groupby(
        sorted(calls, key=lambda c: str(c[1].device)), key=lambda c: str(c[1].device)
    )
    for _, group in by_device:
        items = list(group)
        agree_N = torch.cat([a for _, a, _ in items])
        both_2N = torch.stack((agree_N, agree_N & torch.cat([o for _, _, o in items])))
        running_2N1 = torch.cat((both_2N.new_zeros(2, 1, dtype=torch.int64), both_2N.cumsum(1)), 1)
        ends = torch.tensor([0, *itertools.accumulate(a.numel() for _, a, _ in items)])
        per_call_C2 = running_2N1[:, ends.to(agree_N.device)].diff(dim=1).T
        owner_C = torch.tensor([j for j, _, _ in items], device=agree_N.device)
        sums_J2 = per_call_C2.new_zeros(len(owners), 2).index_add_(0, owner_C, per_call_C2)
        for j in sorted({j for j, _, _ in items}):
            tally = owners[j]
            tally.hits = sums_J2[j] if tally.hits is None else tally.hits + sums_J2[j]
    for tally in owners:
        tally.pending.clear()


class Agreement:
    """The step's agreement, one :class:`Tally` per router (walk index) that replayed."""

    def __init__(self) -> None:
        self._tallies: dict[int, Tally] = {}
        self._pending_rows = 0  # rows of agreement tests not summed yet (all routers)

    def add(self, index: int, agree_T: torch.Tensor, in_order_T: torch.Tensor, rows: int) -> None:
        """Keep one call's row tests; ``rows`` of them replayed."""
        # the row tests stay on their device, unsummed, until the report: no reduction and
        # no host sync per router call
        tally = self._tallies.setdefault(index, Tally())
        self._pending_rows += tally.add(agree_T, in_order_T, rows)
        if self._pending_rows > MAX_PENDING_ROWS:
            settle(self._tallies)
            self._pending_rows = 0

    def count_on_host(
        self,
        index: int,
        rows: int,
        scores_TE: np.ndarray,
        ids_TK: np.ndarray,
        mask_T: np.ndarray | None,
    ) -> None:
        """Count one call on the host as it runs (the compiled pass): nothing pending, nothing
        to sum at the step's end."""
        tally = self._tallies.setdefault(index, Tally())
        tally.rows += rows
        agreement_numba.count_agreement(scores_TE, ids_TK, mask_T, tally.counted)

    def shares(self, column: int, layers: tuple[int, ...]) -> dict[int, float]:
        """Per layer (``layers[index]``), the share of replayed rows that passed test
        ``column`` (0: same set, 1: same set in score order); layers with no row are absent."""
        if not self._tallies:
            return {}
        settle(self._tallies)
        self._pending_rows = 0
        return {
            layers[index]: tally.count(column) / tally.rows
            for index, tally in sorted(self._tallies.items())
            if tally.rows
        }

    def end_step(self) -> None:
        self._tallies = {}
        self._pending_rows = 0
