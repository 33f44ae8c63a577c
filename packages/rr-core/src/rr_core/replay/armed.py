"""The armed targets: each micro-batch's replay targets, checked once when armed and kept until
the step ends (B2), with where they came from.

Shapes: T rows the router sees, R armed source rows, N rows outside the replay mask, L layer
slots, K top-k.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from rr_core.checks import check_instance, describe
from rr_core.errors import ReplayError
from rr_core.replay import replay_numba
from rr_core.replay.checks import (
    check_flag,
    check_hashable,
    check_mask,
    check_routes,
    check_rows,
    check_target_ids,
    layer_numbers_of,
)
from rr_core.routes.batch import RouteBatch


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


class ArmedTargets:
    """The targets armed this step, per micro-batch, and the provenance of those armed from a
    route batch. ``layers`` (the attached routers' layer numbers) is passed to each call that
    maps route slots to routers: the targets hold no model of their own."""

    def __init__(self) -> None:
        self._armed: dict[Hashable, Armed] = {}
        self._provenance: dict[Hashable, dict[str, Any]] = {}  # where each batch's routes came from
        # slot maps by the routes' layer numbers, for the attached layers (cleared on attach)
        self._slot_maps: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._last_layers: tuple[object, tuple[int, ...]] = (object(), ())  # (as passed, checked)
        #: ``get(microbatch)``: the targets armed for it, or None (the dict's own lookup, no
        #: Python frame: every replaying router call asks)
        self.get: Callable[[Hashable], Armed | None] = self._armed.get

    def arm(
        self,
        microbatch: Hashable,
        routes_TLK: torch.Tensor,
        layer_numbers: Sequence[int],
        replay_mask_T: torch.Tensor | None,
        rows_T: torch.Tensor | None,
        validate: bool,
        ids_validated: bool,
        layers: tuple[int, ...],
        num_experts: int,
        top_k: int,
    ) -> None:
        """Check and keep one micro-batch's targets (see :meth:`ReplayController.arm`; the
        controller passes its arguments in this order, without building keywords)."""
        check_hashable(microbatch)
        check_routes(microbatch, routes_TLK)
        if microbatch in self._armed:
            raise ReplayError(
                f"micro-batch {microbatch!r} is still armed from an earlier pass; call "
                "end_step() (or release()) between passes so stale targets are never replayed"
            )
        if self._last_layers[0] is layer_numbers:  # the same (immutable) tuple as last time
            key = self._last_layers[1]
        else:
            key = layer_numbers_of(layer_numbers, "layer_numbers")
            if type(layer_numbers) is tuple:
                self._last_layers = (layer_numbers, key)
        slot_of_router = self._slot_maps.get(key)
        if slot_of_router is None:
            slot_of_router = self._slot_maps[key] = _slot_map(key, layers)
        if routes_TLK.dim() != 3 or routes_TLK.shape[1:] != (len(key), top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes must be [T, {len(key)}, {top_k}] "
                f"(T, layer slots, top-k); got {list(routes_TLK.shape)}"
            )
        if rows_T is not None:
            check_rows(microbatch, rows_T, routes_TLK)
        rows = routes_TLK.shape[0] if rows_T is None else rows_T.shape[0]
        check_mask(microbatch, replay_mask_T, rows)
        check_flag("validate", validate)
        check_flag("ids_validated", ids_validated)
        if validate:
            check_target_ids(
                routes_TLK,
                num_experts=num_experts,
                replay_mask_T=replay_mask_T,
                slot_layers={slot: layers[i] for i, slot in enumerate(slot_of_router)},
                microbatch=microbatch,
                rows_T=rows_T,
            )
        self._armed[microbatch] = Armed(
            routes_TLK,
            slot_of_router,
            replay_mask_T,
            [False] * len(layers),
            rows_T=rows_T,
            validated=validate or ids_validated,
            rows=rows,
        )

    def arm_batch(
        self,
        microbatch: Hashable,
        batch: RouteBatch,
        *,
        provenance: Mapping[str, Any] | None,
        layers: tuple[int, ...],
        num_experts: int,
        top_k: int,
    ) -> None:
        """Arm a :class:`RouteBatch` (see :meth:`ReplayController.arm_batch`)."""
        if provenance is not None and (
            not isinstance(provenance, Mapping) or not all(isinstance(k, str) for k in provenance)
        ):
            raise ReplayError(
                f"micro-batch {microbatch!r}: provenance must map setting names (str) to values; "
                f"got {describe(provenance)}"
            )
        check_instance(
            batch,
            RouteBatch,
            ReplayError,
            f"micro-batch {microbatch!r}: arm_batch takes a RouteBatch",
            " (use arm() for a [T, L, K] tensor)",
        )
        meta = batch.meta
        if (meta.num_experts, meta.top_k) != (num_experts, top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes were captured with E={meta.num_experts}, "
                f"K={meta.top_k}; this model has E={num_experts}, K={top_k}"
            )
        self.arm(
            microbatch,
            batch.values_NLK,
            meta.layer_numbers,
            batch.valid_N,
            None,  # rows_T: the batch's rows are the router's
            False,  # validate: checked when the batch was (ids_validated), or by the caller
            batch.ids_validated,  # on its valid rows: the rows that replay
            layers,
            num_experts,
            top_k,
        )
        if provenance is not None:
            self._provenance[microbatch] = dict(provenance)

    def view(self) -> Mapping[Hashable, Armed]:
        """The armed targets by micro-batch, read-only."""
        return types.MappingProxyType(self._armed)

    def release(self, microbatch: Hashable) -> None:
        """Drop one micro-batch's targets and provenance, unchecked."""
        self._armed.pop(microbatch, None)
        self._provenance.pop(microbatch, None)

    def microbatches(self) -> tuple[Hashable, ...]:
        """The armed micro-batches, in the order they were armed."""
        return tuple(self._armed)

    def provenance(self) -> tuple[dict[str, Any], ...]:
        """Each distinct provenance of this step's armed batches, in the order first armed."""
        if not self._provenance:
            return ()
        out: list[dict[str, Any]] = []
        for item in self._provenance.values():
            if item not in out:
                out.append(item)
        return tuple(out)

    def unused(self, layers: tuple[int, ...]) -> dict[Hashable, list[int]]:
        """Per armed micro-batch, the layers whose routers never replayed its targets in a
        forward (micro-batches whose targets were all used are left out)."""
        unused = {
            mb: [layers[i] for i, used in enumerate(armed.consumed) if not used]
            for mb, armed in self._armed.items()
        }
        return {mb: missed for mb, missed in unused.items() if missed}

    def end_step(self) -> None:
        """Drop every target and provenance (the slot maps stay: the model is the same)."""
        self._armed.clear()  # in place: ``get`` is this dict's lookup
        self._provenance.clear()

    def forget_model(self) -> None:
        """A model was attached or detached: drop the targets and the slot maps of its layers."""
        self.end_step()
        self._slot_maps.clear()


def _slot_map(layer_numbers: tuple[int, ...], layers: tuple[int, ...]) -> tuple[int, ...]:
    """Per attached router (walk order), the slot of the routes' layer axis holding its layer."""
    slot = {layer: i for i, layer in enumerate(layer_numbers)}
    if len(slot) != len(layer_numbers):
        raise ReplayError(f"layer_numbers repeat a layer: {list(layer_numbers)}")
    missing = [layer for layer in layers if layer not in slot]
    if missing:
        raise ReplayError(
            f"routes cover layers {list(layer_numbers)} but the model has routers on layers "
            f"{missing} that they do not cover; pass the routes' true global layer numbers "
            "(an all_layers axis starts at layer 1, a moe_layers axis lists MoE layers only)"
        )
    return tuple(slot[layer] for layer in layers)
