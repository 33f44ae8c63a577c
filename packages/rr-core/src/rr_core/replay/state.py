"""The state a :class:`~rr_core.replay.controller.ReplayController` keeps, shared by the
modules that handle one concern each (arming, micro-batch scope, the step report).

Shapes: T rows the router sees, R armed source rows, N rows outside the replay mask, L layer
slots, K top-k.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn

from rr_core.errors import ReplayError
from rr_core.replay import replay_numba
from rr_core.replay.modes import ReplayMode
from rr_core.replay.tally import Tally

#: The micro-batch a forward belongs to when no :meth:`ReplayController.microbatch` is open.
DEFAULT_MICROBATCH = 0


@dataclass
class Armed:
    """One micro-batch's targets, as armed."""

    routes_TLK: torch.Tensor  # as armed: [R, L, K] source rows when rows_T is given
    slot_of_router: tuple[int, ...]  # walk index -> slot on the routes' layer axis
    mask_T: torch.Tensor | None
    consumed: list[bool]
    rows_T: torch.Tensor | None = None  # router row t replays source row rows_T[t]
    validated: bool = False  # ids in range, distinct per replayed row (checked here or upstream)
    rows: int = 0  # the rows each router call sees (T)
    replayed_rows: int = field(init=False)  # how many rows replay (counted once, at arming)

    def __post_init__(self) -> None:
        if self.mask_T is None:
            self.replayed_rows = self.rows
        elif self.mask_T.device.type == "cpu":
            # a count of the host view (torch's nonzero and numel cost more); the torch path
            # finds the native rows on first use
            mask_np = self.mask_numpy
            assert mask_np is not None
            self.replayed_rows = int(np.count_nonzero(mask_np))
        else:
            # the native rows found here, once: each router call on an accelerator would
            # otherwise sync with the host to find them
            native_N = self.native_rows
            assert native_N is not None
            self.replayed_rows = self.rows - native_N.numel()

    @cached_property
    def native_rows(self) -> torch.Tensor | None:
        """The rows outside the replay mask (None without one), found once."""
        return None if self.mask_T is None else (~self.mask_T).nonzero().flatten()

    @cached_property
    def mask_numpy(self) -> np.ndarray | None:
        """The replay mask as a numpy array on the host (made once: the compiled passes read it
        on every router call of the micro-batch)."""
        return None if self.mask_T is None else self.mask_T.cpu().numpy()

    @cached_property
    def host_ids(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The armed ids ``[R, L, K]`` and the row index as numpy arrays, for the compiled replay
        pass (:mod:`rr_core.replay.replay_numba`), or None where it cannot read them: ids not
        checked (at arming or upstream), off the CPU, or of a dtype it does not take. Made on
        first use: a call that takes the torch path never needs them."""
        routes = self.routes_TLK
        readable = (
            self.validated
            and routes.device.type == "cpu"
            and routes.dtype in replay_numba.ID_DTYPES
        )
        if not readable:
            return None
        return routes.numpy(), None if self.rows_T is None else self.rows_T.numpy()

    def target_TK(self, index: int) -> torch.Tensor:
        """The ``[T, K]`` ids router ``index`` (walk order) replays, in its token order."""
        slot_RK = self.routes_TLK[:, self.slot_of_router[index]]
        if self.rows_T is None:
            return slot_RK
        # a [T, K] gather per router call instead of a [T, L, K] one per micro-batch at arming
        return slot_RK.index_select(0, self.rows_T)


class ControllerState:
    """Attributes every concern of the controller reads; set by the controller's constructor."""

    num_experts: int
    top_k: int
    strict: bool
    _routers: list[nn.Module]
    _layers: tuple[int, ...]
    _index: dict[int, int]  # id(router) -> walk index
    _position: dict[int, int]  # layer number -> walk index
    _modes: list[ReplayMode]
    _attached: bool
    _armed: dict[Hashable, Armed]
    _recorded: dict[Hashable, list[torch.Tensor | None]]
    _agreement: dict[int, Tally]  # walk index -> its agreement this step
    _pending_rows: int  # rows of agreement tests not summed yet (all routers)
    _provenance: dict[Hashable, dict[str, Any]]  # where each armed batch's routes came from
    _forward_mbs: set[Hashable]
    _forward_mb: Hashable | None
    _backward_mb: Hashable | None

    def _check_attached(self, method: str) -> None:
        if not self._attached:
            raise ReplayError(
                f"no model attached; call attach(model) before {method}() (a pipeline stage "
                "without MoE layers attaches too, and then has zero routers)"
            )

    def _reset_step(self) -> None:
        self._armed = {}
        self._recorded = {}
        self._agreement = {}
        self._pending_rows = 0
        self._provenance = {}
        self._forward_mbs = set()
        self._forward_mb = None
        self._backward_mb = None
