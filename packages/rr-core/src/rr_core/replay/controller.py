"""The replay controller: per-router RECORD / REPLAY with targets keyed by micro-batch.

Shapes: T tokens, E experts, K top-k, L layer slots.

A router calls :func:`router_topk` at its top-k step. Routers of a model that was never
attached to a controller (reference, critic, teacher models: C5) always route natively.
Targets are armed per micro-batch id; the forward of micro-batch m consumes m's targets and the
backward recompute of m reuses them whatever order the pipeline schedule runs it in (B1).
Every target lives until :meth:`ReplayController.end_step`, which checks that all were used and
clears them, so a forward-only pass leaves nothing for the next backward (B2).

One concern per module: :mod:`~rr_core.replay.arming` (targets),
:mod:`~rr_core.replay.scope` (micro-batch contexts), :mod:`~rr_core.replay.report` (records,
agreement, the step's end); this one attaches the model and routes each call.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rr_core.errors import ReplayError, RRWarning
from rr_core.replay import agreement_numba, replay_numba
from rr_core.replay.arming import Arming
from rr_core.replay.modes import ReplayMode, as_mode, layer_numbers_of, unchecked_ids_error
from rr_core.replay.owners import OWNERS, attached_router_count, controller_of, router_topk
from rr_core.replay.report import StepReport, StepReports
from rr_core.replay.scope import MicrobatchScopes, in_backward
from rr_core.replay.state import DEFAULT_MICROBATCH, Armed
from rr_core.replay.tally import Tally
from rr_core.replay.topk import (
    TopK,
    check_real_scores,
    checked_values,
    in_score_order_T,
    native_ids,
    native_topk,
    replay_checked,
    replay_topk,
    same_sets_T,
    topk_set_and_order_T,
)
from rr_core.replay.walk import RouterPredicate, decoder_scope, is_router_by_name, walk_routers

__all__ = [
    "DEFAULT_MICROBATCH",
    "ReplayController",
    "ReplayMode",
    "StepReport",
    "as_mode",
    "attached_router_count",
    "controller_of",
    "replayed_unchecked_ids",
    "router_topk",
]

#: Per thread: whether the latest replaying router call replayed ids armed with validate=False.
_LATEST = threading.local()


def replayed_unchecked_ids() -> bool:
    """Whether the latest replaying router call on this thread replayed targets armed with
    ``validate=False`` (ids never checked for range or repeats). Checked targets hold K distinct
    ids per replayed row and native rows come from a top-k, so an adapter that sizes buffers as
    K per row needs to count the routing map only after a call for which this is True."""
    return bool(getattr(_LATEST, "unchecked", False))


class ReplayController(Arming, MicrobatchScopes, StepReports):
    """Records or replays the top-k ids of one model's routers.

    ``num_experts`` and ``top_k`` are checked against every router call and every armed target.
    ``strict=False`` turns "fired with nothing armed" and "targets never used" into warnings
    (with native routing); keep it True in training.

    ``measure_agreement`` (the step report's agreement): True tests each replayed row against
    the scores the router already has (its replayed set is the native one when no expert
    outside it scores above its lowest member: a compare and a count, no second top-k; a tie
    at that lowest score counts as agreeing); ``"exact"`` runs the native top-k beside every
    replayed one and compares the sets (the same count but at such ties, for a top-k's cost);
    False measures nothing.
    """

    measure_agreement: bool | str

    def __init__(
        self,
        *,
        num_experts: int,
        top_k: int,
        strict: bool = True,
        measure_agreement: bool | str = True,
    ) -> None:
        if not all(type(v) is int for v in (num_experts, top_k)):
            raise ReplayError(
                f"num_experts and top_k must be ints; got {num_experts=!r}, {top_k=!r}"
            )
        if num_experts < 1 or not 1 <= top_k <= num_experts:
            raise ReplayError(f"need 1 <= top_k <= num_experts; got {top_k=}, {num_experts=}")
        if measure_agreement not in (True, False, "exact") or type(measure_agreement) is int:
            raise ReplayError(
                f"measure_agreement must be True (a threshold test on the router's scores), "
                f"'exact' (a second top-k) or False; got {measure_agreement!r}"
            )
        self.num_experts, self.top_k = num_experts, top_k
        self.strict, self.measure_agreement = strict, measure_agreement
        self._routers = []
        self._layers = ()
        self._index = {}
        self._position = {}
        self._modes = []
        self._slot_maps = {}
        self._attached = False
        self._reset_step()

    # -- model ---------------------------------------------------------------------------
    def attach(
        self,
        model: nn.Module | Sequence[nn.Module],
        *,
        is_router: RouterPredicate = is_router_by_name,
        scope: Callable[[nn.Module], nn.Module] = decoder_scope,
        walk: Callable[[Any], Sequence[tuple[int, nn.Module]]] | None = None,
    ) -> tuple[int, ...]:
        """Walk the forwarded model (or its VPP chunks) once and take ownership of its routers.
        ``walk`` replaces :func:`walk_routers` for models whose layers carry no
        ``layer_number`` (it returns ``(global layer number, router)`` pairs). Re-attaching
        detaches the previous model first. Returns the layer numbers found."""
        if walk is None:
            walked = walk_routers(model, is_router=is_router, scope=scope)
        else:
            walked = _checked_walk(walk(model))
        for layer, router in walked:
            owner = OWNERS.get(router)
            if owner is not None and owner is not self:
                raise ReplayError(
                    f"the router of layer {layer} is already attached to another controller; "
                    "detach that one first (one controller per model)"
                )
        self.detach()
        self._layers = tuple(layer for layer, _ in walked)
        self._routers = [router for _, router in walked]
        self._index = {id(router): i for i, router in enumerate(self._routers)}
        self._position = {layer: i for i, layer in enumerate(self._layers)}
        self._modes = [ReplayMode.OFF] * len(self._routers)
        self._attached = True  # also with zero routers: a stage of dense layers only (A6)
        for router in self._routers:
            OWNERS[router] = self
        return self._layers

    def detach(self) -> None:
        """Release the routers (they route natively again) and drop all step state."""
        for router in self._routers:
            if OWNERS.get(router) is self:
                del OWNERS[router]
        self._routers, self._layers, self._index, self._modes = [], (), {}, []
        self._position = {}
        self._attached = False
        self._slot_maps.clear()
        self._reset_step()

    @property
    def layer_numbers(self) -> tuple[int, ...]:
        """Global 1-based layer numbers of the attached routers, ascending."""
        return self._layers

    def set_mode(self, mode: ReplayMode | str, *, layers: Sequence[int] | None = None) -> None:
        """Set the mode of all attached routers, or of those on ``layers``. ``mode`` is a
        :class:`ReplayMode` or exactly its value; anything else raises :class:`ReplayError`."""
        checked = as_mode(mode)
        self._check_attached("set_mode")
        chosen = range(len(self._routers)) if layers is None else self._indices_of(layers)
        for i in chosen:
            self._modes[i] = checked

    def mode_of(self, layer: int) -> ReplayMode:
        # adapters ask once per router call: a plain int of an attached layer is one lookup
        # (type(...) is int: a bool or a numpy int goes the checked way, which says why)
        index = self._position.get(layer) if type(layer) is int else None
        if index is None:
            index = self._indices_of([layer])[0]
        return self._modes[index]

    def _indices_of(self, layers: Sequence[int]) -> list[int]:
        layers = layer_numbers_of(layers, "layers")
        missing = [layer for layer in layers if layer not in self._position]
        if missing:
            raise ReplayError(f"layers {missing} have no attached router; have {self._layers}")
        return [self._position[layer] for layer in layers]

    # -- the router call -------------------------------------------------------------------
    def route(
        self,
        router: nn.Module,
        scores_TE: torch.Tensor,
        k: int,
        *,
        values_TE: torch.Tensor | None = None,
    ) -> TopK:
        """Top-k for one attached router according to its mode (see :func:`router_topk`)."""
        index = self._index.get(id(router))
        if index is None:
            raise ReplayError(
                "route() called with a router that is not attached to this controller"
            )
        mode, layer = self._modes[index], self._layers[index]
        if mode is ReplayMode.OFF:
            return native_topk(scores_TE, k, values_TE=values_TE)
        shape = scores_TE.shape  # read once: each tensor attribute is a call
        if len(shape) != 2 or shape[1] != self.num_experts or k != self.top_k:
            raise ReplayError(
                f"layer {layer}: router gave scores {list(shape)} with k={k}; the "
                f"controller expects [T, {self.num_experts}] and k={self.top_k}"
            )
        backward = in_backward()
        microbatch = self._resolve_microbatch(layer, backward)
        if not backward:
            self._forward_mbs.add(microbatch)
        if mode is ReplayMode.RECORD:
            return self._record(index, microbatch, backward, scores_TE, values_TE)
        return self._replay(index, microbatch, backward, scores_TE, values_TE, shape[0])

    def _record(
        self,
        index: int,
        microbatch: Hashable,
        backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
    ) -> TopK:
        records = self._recorded.setdefault(microbatch, [None] * len(self._routers))
        recorded_TK = records[index]
        if backward and recorded_TK is not None:  # recompute must route as the forward did
            return replay_topk(
                scores_TE, self.top_k, target_ids_TK=recorded_TK, values_TE=values_TE
            )
        if recorded_TK is not None:
            raise ReplayError(
                f"layer {self._layers[index]} recorded twice for micro-batch {microbatch!r}; "
                "give each forward its own micro-batch id or call end_step() between passes"
            )
        # ids off the graph and values by gather, as the recompute above replays them: a
        # non-reentrant checkpoint then sees the same saved tensors in forward and recompute
        # (torch.topk saves the [T, K] ids, a gather the [T, E] scores too: CheckpointError)
        ids_TK = native_ids(scores_TE, self.top_k)  # its top-k ranked these scores: all checked
        records[index] = ids_TK
        return replay_checked(scores_TE, self.top_k, ids_TK, values_TE=values_TE)

    def _replay(
        self,
        index: int,
        microbatch: Hashable,
        backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
        rows: int,
    ) -> TopK:
        layer = self._layers[index]
        armed = self._armed.get(microbatch)
        _LATEST.unchecked = armed is not None and not armed.validated
        if armed is None:
            message = (
                f"layer {layer} fired in REPLAY for micro-batch {microbatch!r} but nothing is "
                f"armed for it (armed: {sorted(map(repr, self._armed))}); arm its routes first"
            )
            if self.strict:
                raise ReplayError(message)
            warnings.warn(message + "; routing natively (strict=False)", RRWarning, stacklevel=3)
            return native_topk(scores_TE, self.top_k, values_TE=values_TE)
        if armed.rows != rows:
            raise ReplayError(
                f"layer {layer}, micro-batch {microbatch!r}: router sees {rows} "
                f"tokens but {armed.rows} rows are armed; arm rows in the router's "
                "token order (after sequence-parallel scatter, context-parallel split, packing)"
            )
        exact = self.measure_agreement == "exact" and not backward
        # route() checked the scores' shape and k; arm() the targets' dtype and shape and the
        # mask: only the scores' dtype is left to check here
        dtype, device = check_real_scores(scores_TE), scores_TE.device
        on_host = not exact and agreement_numba.runs_on(device, dtype)
        host_ids = armed.host_ids if on_host else None
        if host_ids is not None:
            return self._replay_on_host(index, armed, backward, scores_TE, values_TE, host_ids)
        target_TK = armed.target_TK(index)
        native_TK = native_ids(scores_TE, self.top_k) if exact else None
        try:
            out = replay_checked(
                scores_TE,
                self.top_k,
                target_TK,
                armed.mask_T,
                values_TE,
                native_TK,
                armed.native_rows,
                device,
            )
        except (IndexError, RuntimeError) as e:  # only unchecked (validate=False) ids get here
            bad = unchecked_ids_error(target_TK, armed.mask_T, self.num_experts)
            if bad is None:
                raise
            raise ReplayError(f"layer {layer}, micro-batch {microbatch!r}: {bad}") from e
        if not backward:
            armed.consumed[index] = True
        if self.measure_agreement and not backward:
            if native_TK is None and on_host:  # the gather took the ids: all in range
                self._count_on_host(index, armed, scores_TE.detach().numpy(), out.ids_TK.numpy())
                return out
            if native_TK is not None:
                agree_T = same_sets_T(out.ids_TK, native_TK)
                in_order_T = in_score_order_T(scores_TE, out.ids_TK)
            else:
                agree_T, in_order_T = topk_set_and_order_T(scores_TE, out.ids_TK)
            if armed.mask_T is not None:
                agree_T &= armed.mask_T.to(agree_T.device, non_blocking=True)
            self._add_agreement(index, agree_T, in_order_T, armed.replayed_rows)
        return out

    def _replay_on_host(
        self,
        index: int,
        armed: Armed,
        backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
        host_ids: tuple[np.ndarray, np.ndarray | None],
    ) -> TopK:
        """A replaying call on the CPU: the ids from one compiled pass (armed ids, R3's native
        rows ranked), one gather for the values, the agreement counted on the host."""
        scores_np = scores_TE.detach().numpy()
        routes_RLK, rows_T = host_ids
        mask_T = armed.mask_numpy
        ids_np = replay_numba.replay_ids_cpu(
            scores_np, routes_RLK, armed.slot_of_router[index], rows_T, mask_T, self.top_k
        )
        ids_TK = torch.from_numpy(ids_np)
        source_TE = scores_TE if values_TE is None else checked_values(values_TE, scores_TE)
        out = TopK(source_TE.gather(-1, ids_TK), ids_TK)
        if not backward:
            armed.consumed[index] = True
            if self.measure_agreement:
                self._count_on_host(index, armed, scores_np, ids_np)
        return out

    def _count_on_host(
        self, index: int, armed: Armed, scores_TE: np.ndarray, ids_TK: np.ndarray
    ) -> None:
        # counted as the call runs, into the tally's host counts: nothing pending, nothing
        # to sum at the step's end
        tally = self._agreement.setdefault(index, Tally())
        tally.rows += armed.replayed_rows
        agreement_numba.count_agreement(scores_TE, ids_TK, armed.mask_numpy, tally.counted)

    def replay_mask(self, router: nn.Module) -> torch.Tensor | None:
        """The replay mask in effect for ``router``'s current call (rows marked False route
        natively), for statistics that must skip rows the rollout never routed (C4). None when
        every row is replayed, the router is not replaying, or nothing is armed."""
        index = self._index.get(id(router))
        if index is None or self._modes[index] is not ReplayMode.REPLAY:
            return None
        microbatch = self._resolve_microbatch(self._layers[index], in_backward())
        armed = self._armed.get(microbatch)
        return None if armed is None else armed.mask_T


def _checked_walk(walked: object) -> list[tuple[int, nn.Module]]:
    """A custom walk's pairs, sorted by layer: each an (int >= 1, nn.Module), layers unique."""
    pairs = list(walked) if isinstance(walked, Sequence) else None
    if pairs is None or not all(
        isinstance(p, tuple)
        and len(p) == 2
        and type(p[0]) is int
        and p[0] >= 1
        and isinstance(p[1], nn.Module)
        for p in pairs
    ):
        raise ReplayError(
            "walk must return a sequence of (global 1-based layer number, router module) "
            f"pairs; got {walked!r:.200}"
        )
    layers = [layer for layer, _ in pairs]
    if len(set(layers)) != len(layers) or len({id(r) for _, r in pairs}) != len(pairs):
        raise ReplayError(f"walk returned a layer or a router twice: layers {layers}")
    return sorted(pairs, key=lambda p: p[0])
