"""The replay controller: per-router RECORD / REPLAY with targets keyed by micro-batch.

Shapes: T tokens, E experts, K top-k, L layer slots.

A router calls :func:`router_topk` at its top-k step. Routers of a model that was never
attached to a controller (reference, critic, teacher models: C5) always route natively.
Targets are armed per micro-batch id; the forward of micro-batch m consumes m's targets and the
backward recompute of m reuses them whatever order the pipeline schedule runs it in (B1).
Every target lives until :meth:`ReplayController.end_step`, which checks that all were used and
clears them, so a forward-only pass leaves nothing for the next backward (B2).

The controller is a facade over parts that each own their state: the attached routers and their
modes (:mod:`~rr_core.replay.routers`), the armed targets (:mod:`~rr_core.replay.armed`), the
micro-batch scopes (:mod:`~rr_core.replay.scope`), the records
(:mod:`~rr_core.replay.recording`) and the step's agreement (:mod:`~rr_core.replay.tally`); a
replaying call runs in :mod:`~rr_core.replay.replaying`, the argument checks live in
:mod:`~rr_core.replay.checks`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
from torch import nn

from rr_core.errors import ReplayError, RRWarning
from rr_core.replay.armed import Armed, ArmedTargets
from rr_core.replay.checks import check_hashable, checked_walk
from rr_core.replay.modes import ReplayMode, as_mode
from rr_core.replay.owners import attached_router_count, owner_of
from rr_core.replay.recording import Records
from rr_core.replay.replaying import note_nothing_armed, replay_call, replayed_unchecked_ids
from rr_core.replay.report import StepReport
from rr_core.replay.routers import AttachedRouters
from rr_core.replay.scope import (
    DEFAULT_MICROBATCH,
    MicrobatchScope,
    MicrobatchScopes,
    in_backward,
)
from rr_core.replay.tally import Agreement
from rr_core.replay.topk import TopK, native_topk
from rr_core.replay.walk import RouterPredicate, decoder_scope, is_router_by_name, walk_routers
from rr_core.routes.batch import RouteBatch

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


def router_topk(
    router: nn.Module, scores_TE: torch.Tensor, k: int, *, values_TE: torch.Tensor | None = None
) -> TopK:
    """The hook point routers call at their top-k step: native top-k unless ``router`` belongs
    to an attached controller whose mode for it is not OFF."""
    controller = owner_of(router, "router_topk")
    if controller is None:
        return native_topk(scores_TE, k, values_TE=values_TE)
    return controller.route(router, scores_TE, k, values_TE=values_TE)


def controller_of(router: nn.Module) -> ReplayController | None:
    """The controller a router is attached to, if any."""
    return cast("ReplayController | None", owner_of(router, "controller_of"))


class ReplayController:
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
        self._router_table = AttachedRouters()
        self._targets = ArmedTargets()
        self._scopes = MicrobatchScopes()
        self._records = Records()
        self._agreement = Agreement()

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
            walked = checked_walk(walk(model))
        self._router_table.attach(walked, self)  # refuses routers another controller holds
        self._targets.forget_model()
        self._end_step()
        return self._router_table.layers

    def detach(self) -> None:
        """Release the routers (they route natively again) and drop all step state."""
        self._router_table.detach(self)
        self._targets.forget_model()
        self._end_step()

    @property
    def layer_numbers(self) -> tuple[int, ...]:
        """Global 1-based layer numbers of the attached routers, ascending."""
        return self._router_table.layers

    def set_mode(self, mode: ReplayMode | str, *, layers: Sequence[int] | None = None) -> None:
        """Set the mode of all attached routers, or of those on ``layers``. ``mode`` is a
        :class:`ReplayMode` or exactly its value; anything else raises :class:`ReplayError`."""
        self._router_table.set_mode(mode, layers)

    def mode_of(self, layer: int) -> ReplayMode:
        return self._router_table.mode_of(layer)

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
        entry = self._router_table.entry(id(router))
        if entry is None:
            raise ReplayError(
                "route() called with a router that is not attached to this controller"
            )
        index, layer, mode = entry
        if mode is ReplayMode.OFF:
            return native_topk(scores_TE, k, values_TE=values_TE)
        shape = scores_TE.shape  # read once: each tensor attribute is a call
        if len(shape) != 2 or shape[1] != self.num_experts or k != self.top_k:
            raise ReplayError(
                f"layer {layer}: router gave scores {list(shape)} with k={k}; the "
                f"controller expects [T, {self.num_experts}] and k={self.top_k}"
            )
        microbatch, backward = self._scopes.call(layer)
        if mode is ReplayMode.RECORD:
            return self._records.route(
                index,
                microbatch,
                backward,
                scores_TE,
                values_TE,
                layers=self._router_table.layers,
                top_k=self.top_k,
            )
        armed = self._targets.get(microbatch)
        if armed is None:
            note_nothing_armed()
            message = (
                f"layer {layer} fired in REPLAY for micro-batch {microbatch!r} but nothing is "
                f"armed for it (armed: {sorted(map(repr, self._targets.microbatches()))}); arm "
                "its routes first"
            )
            if self.strict:
                raise ReplayError(message)
            warnings.warn(message + "; routing natively (strict=False)", RRWarning, stacklevel=3)
            return native_topk(scores_TE, self.top_k, values_TE=values_TE)
        return replay_call(
            index,
            layer,
            microbatch,
            backward,
            scores_TE,
            values_TE,
            shape[0],
            armed,
            self._agreement if self.measure_agreement else None,
            self.measure_agreement == "exact",
            self.num_experts,
            self.top_k,
        )

    def replay_mask(self, router: nn.Module) -> torch.Tensor | None:
        """The replay mask in effect for ``router``'s current call (rows marked False route
        natively), for statistics that must skip rows the rollout never routed (C4). None when
        every row is replayed, the router is not replaying, or nothing is armed."""
        entry = self._router_table.entry(id(router))
        if entry is None or entry[2] is not ReplayMode.REPLAY:
            return None
        microbatch = self._scopes.current(entry[1], in_backward())
        armed = self._targets.get(microbatch)
        return None if armed is None else armed.mask_T

    # -- targets ---------------------------------------------------------------------------
    def arm(
        self,
        microbatch: Hashable,
        routes_TLK: torch.Tensor,
        *,
        layer_numbers: Sequence[int],
        replay_mask_T: torch.Tensor | None = None,
        rows_T: torch.Tensor | None = None,
        validate: bool = True,
        ids_validated: bool = False,
    ) -> None:
        """Arm replay targets for one micro-batch, rows in the router's token order.

        ``layer_numbers`` names the global layer of each slot of ``routes_TLK``; every attached
        router's layer must be among them (extra slots, e.g. dense layers of an ``all_layers``
        axis or other pipeline stages, are ignored). ``replay_mask_T`` marks rows to replay;
        the others route natively. ``rows_T`` (int64 ``[T]``) arms ``routes_TLK`` as ``[R, L, K]``
        source rows, router row t replaying row ``rows_T[t]`` (rows outside the mask may point
        at any row), so a padded batch is armed without laying its routes out row by row; each
        router call then gathers its layer's ``[T, K]`` ids. ``validate=False`` skips the id
        checks for routes that were validated upstream; ids outside ``[0, E)`` then raise when
        a router replays them. ``ids_validated=True`` with it says the replayed rows' ids were
        checked where they were built (a :class:`RouteBatch`'s ``ids_validated``): the
        replaying call then takes the compiled path that checked ids allow.
        Inputs of the wrong type, dtype or shape raise :class:`ReplayError` either way.
        """
        self._router_table.check_attached("arm")
        self._targets.arm(
            microbatch,
            routes_TLK,
            layer_numbers,
            replay_mask_T,
            rows_T,
            validate,
            ids_validated,
            self._router_table.layers,
            self.num_experts,
            self.top_k,
        )

    def arm_batch(
        self,
        microbatch: Hashable,
        batch: RouteBatch,
        *,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        """Arm a :class:`RouteBatch` whose sequences, concatenated, are the tokens the routers
        see (packed/THD order); rows without a route go to the native router. The ids are not
        checked again: a batch built with ``validate=False`` (``ids_validated`` False) replays
        them as they are, and adapters that size buffers by K ids a row then count its rows.
        ``provenance``: where the routes came from (a record header's ``provenance``, or
        ``EngineConfig.provenance()``), shown beside the agreement in the step report."""
        self._router_table.check_attached("arm_batch")
        self._targets.arm_batch(
            microbatch,
            batch,
            provenance=provenance,
            layers=self._router_table.layers,
            num_experts=self.num_experts,
            top_k=self.top_k,
        )

    def release(self, microbatch: Hashable) -> None:
        """Drop one micro-batch's targets and records without checking them."""
        check_hashable(microbatch)
        self._targets.release(microbatch)
        self._records.release(microbatch)

    # -- micro-batch scopes -----------------------------------------------------------------
    def microbatch(self, microbatch: Hashable) -> AbstractContextManager[MicrobatchScope]:
        """Routers firing inside belong to ``microbatch``. Call ``scope.track(output)`` so a
        later backward recompute knows which micro-batch it belongs to."""
        return self._scopes.microbatch(microbatch)

    def backward(self, microbatch: Hashable) -> AbstractContextManager[None]:
        """Explicitly mark a backward (and its recompute) as belonging to ``microbatch``."""
        return self._scopes.backward(microbatch)

    def run_microbatch(
        self, microbatch: Hashable, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """Call ``fn`` as ``microbatch`` and track every tensor of its output for backward."""
        with self._scopes.microbatch(microbatch) as scope:
            out = fn(*args, **kw)
            scope.track(out)
        return out

    # -- the step's results ------------------------------------------------------------------
    def recorded(
        self, microbatch: Hashable = DEFAULT_MICROBATCH, *, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The ids recorded for one micro-batch as ``[T, L, K]`` on the attached routers'
        layers (a ``moe_layers`` axis: ``layer_numbers`` names the slots); ``dtype`` narrows
        them on the way, in one pass."""
        check_hashable(microbatch)
        return self._records.recorded(
            microbatch,
            dtype,
            layers=self._router_table.layers,
            num_experts=self.num_experts,
            top_k=self.top_k,
        )

    def agreement(self) -> dict[int, float]:
        """Per layer, the share of replayed rows whose armed set equals the native set, this
        step so far. Layers that replayed no row are absent."""
        return self._agreement.shares(0, self._router_table.layers)

    def order_agreement(self) -> dict[int, float]:
        """Per layer, the share of replayed rows whose armed set agrees and whose ids are in
        the router's score order, this step so far."""
        return self._agreement.shares(1, self._router_table.layers)

    def end_step(self) -> StepReport:
        """Finish a step: report, check that every armed target was used, and clear all
        targets, records and counters (even when the check fails)."""
        report = StepReport(
            agreement=self.agreement(),
            order_agreement=self.order_agreement(),
            provenance=self._targets.provenance(),
            replayed_microbatches=self._targets.microbatches(),
            recorded_microbatches=self._records.microbatches(),
        )
        unused = self._targets.unused(self._router_table.layers)
        self._end_step()
        if unused:
            message = f"armed targets were never used (micro-batch -> layers): {unused}"
            if self.strict:
                raise ReplayError(message + "; was the router in REPLAY mode, and did it run?")
            warnings.warn(message, RRWarning, stacklevel=2)
        return report

    def _end_step(self) -> None:
        self._targets.end_step()
        self._records.end_step()
        self._agreement.end_step()
        self._scopes.reset()

    # -- read-only views of the parts' state, for subclasses and adapters written against ----
    # -- the one-object controller (rr_fakes' rollout recorder, rr_megatron_compat.verl, ----
    # -- rr_transformers' packed forward guard) -------------------------------------------
    @property
    def _armed(self) -> Mapping[Hashable, Armed]:
        """The armed targets by micro-batch (rr_megatron_compat.verl's router view reads them)."""
        return self._targets.view()

    @property
    def _forward_mb(self) -> Hashable | None:
        """The open forward scope's micro-batch, None outside any (rr_transformers' packed
        forward guard reads it)."""
        return self._scopes.forward_microbatch()

    @property
    def _routers(self) -> list[nn.Module]:
        """The attached routers in walk order (ascending layer)."""
        return self._router_table.modules()

    @property
    def _layers(self) -> tuple[int, ...]:
        return self._router_table.layers

    @property
    def _index(self) -> Mapping[int, int]:
        """id(router) -> walk index of the attached routers."""
        return self._router_table.walk_index()
