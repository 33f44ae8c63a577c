"""The replay controller: per-router RECORD / REPLAY with targets keyed by micro-batch.

Shapes: T tokens, E experts, K top-k, L layer slots.

A router calls :func:`router_topk` at its top-k step. Routers of a model that was never
attached to a controller (reference, critic, teacher models: C5) always route natively.
Targets are armed per micro-batch id; the forward of micro-batch m consumes m's targets and the
backward recompute of m reuses them whatever order the pipeline schedule runs it in (B1).
Every target lives until :meth:`ReplayController.end_step`, which checks that all were used and
clears them, so a forward-only pass leaves nothing for the next backward (B2).
"""

from __future__ import annotations

import enum
import operator
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rr_core.errors import ReplayError, RRWarning
from rr_core.replay.targets import check_target_ids
from rr_core.replay.topk import TopK, native_ids, native_topk, replay_topk, same_sets_T
from rr_core.replay.walk import RouterPredicate, decoder_scope, is_router_by_name, walk_routers
from rr_core.routes.batch import RouteBatch

#: The micro-batch a forward belongs to when no :meth:`ReplayController.microbatch` is open.
DEFAULT_MICROBATCH = 0

_OWNERS: weakref.WeakKeyDictionary[nn.Module, ReplayController] = weakref.WeakKeyDictionary()


class ReplayMode(enum.Enum):
    """What an attached router does at its top-k step."""

    OFF = "off"  # native routing
    RECORD = "record"  # native routing, ids stored per micro-batch
    REPLAY = "replay"  # armed ids on valid rows, native routing on the others


_MODES = {mode.value: mode for mode in ReplayMode}
# Integer dtypes arm() takes; the ids keep their dtype until a router widens its column.
_ID_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.uint16, torch.uint32, torch.uint64}
)


def as_mode(mode: object) -> ReplayMode:
    """``mode`` as a :class:`ReplayMode`: a member, or exactly a member's value (``"off"``,
    ``"record"``, ``"replay"``). Anything else raises: a mode that is not understood must never
    fall through to one of the others."""
    if isinstance(mode, ReplayMode):
        return mode
    if isinstance(mode, str) and mode in _MODES:
        return _MODES[mode]
    accepted = ", ".join(f"ReplayMode.{m.name} ({m.value!r})" for m in ReplayMode)
    raise ReplayError(f"mode must be one of {accepted}; got {mode!r} ({type(mode).__name__})")


def _layer_numbers(layers: object, what: str) -> tuple[int, ...]:
    """``layers`` as a tuple of 1-based ints (numpy / torch integers allowed, bools not)."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ReplayError(
            f"{what} must be a sequence of 1-based layer numbers; got {type(layers).__name__}"
        )
    items = tuple(layers)
    try:
        numbers = tuple(operator.index(n) for n in items if not isinstance(n, bool))
    except TypeError:
        numbers = ()
    if len(numbers) != len(items) or any(n < 1 for n in numbers):
        raise ReplayError(f"{what} must hold 1-based integer layer numbers; got {list(items)!r}")
    return numbers


@dataclass
class _Armed:
    routes_TLK: torch.Tensor
    slot_of_router: tuple[int, ...]  # walk index -> slot on the routes' layer axis
    mask_T: torch.Tensor | None
    consumed: list[bool]
    native_rows_N: torch.Tensor | None = None  # rows outside the mask (found once, at arming)


@dataclass(frozen=True)
class StepReport:
    """What happened in a step: agreement per layer (share of replayed rows whose armed set
    equals the native set; 1.0 everywhere suggests replay changed nothing) and the micro-batches."""

    agreement: dict[int, float] = field(default_factory=dict)
    replayed_microbatches: tuple[Hashable, ...] = ()
    recorded_microbatches: tuple[Hashable, ...] = ()


def router_topk(
    router: nn.Module, scores_TE: torch.Tensor, k: int, *, values_TE: torch.Tensor | None = None
) -> TopK:
    """The hook point routers call at their top-k step: native top-k unless ``router`` belongs
    to an attached controller whose mode for it is not OFF."""
    controller = _OWNERS.get(router)
    if controller is None:
        return native_topk(scores_TE, k, values_TE=values_TE)
    return controller.route(router, scores_TE, k, values_TE=values_TE)


def controller_of(router: nn.Module) -> ReplayController | None:
    """The controller a router is attached to, if any."""
    return _OWNERS.get(router)


def attached_router_count() -> int:
    """How many routers are attached to some controller in this process (leak checks)."""
    return len(_OWNERS)


def _in_backward() -> bool:
    # -1 outside autograd's engine; recompute (reentrant or not) runs inside a backward task.
    return bool(torch._C._current_graph_task_id() != -1)


class ReplayController:
    """Records or replays the top-k ids of one model's routers.

    ``num_experts`` and ``top_k`` are checked against every router call and every armed target.
    ``strict=False`` turns "fired with nothing armed" and "targets never used" into warnings
    (with native routing); keep it True in training.
    """

    _armed: dict[Hashable, _Armed]
    _recorded: dict[Hashable, list[torch.Tensor | None]]
    _agreement: dict[int, tuple[torch.Tensor, torch.Tensor]]
    _forward_mbs: set[Hashable]
    _forward_mb: Hashable | None
    _backward_mb: Hashable | None

    def __init__(
        self, *, num_experts: int, top_k: int, strict: bool = True, measure_agreement: bool = True
    ) -> None:
        if not all(type(v) is int for v in (num_experts, top_k)):
            raise ReplayError(
                f"num_experts and top_k must be ints; got {num_experts=!r}, {top_k=!r}"
            )
        if num_experts < 1 or not 1 <= top_k <= num_experts:
            raise ReplayError(f"need 1 <= top_k <= num_experts; got {top_k=}, {num_experts=}")
        self.num_experts, self.top_k = num_experts, top_k
        self.strict, self.measure_agreement = strict, measure_agreement
        self._routers: list[nn.Module] = []
        self._layers: tuple[int, ...] = ()
        self._index: dict[int, int] = {}  # id(router) -> walk index
        self._modes: list[ReplayMode] = []
        self._slot_maps: dict[tuple[int, ...], tuple[int, ...]] = {}
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
            owner = _OWNERS.get(router)
            if owner is not None and owner is not self:
                raise ReplayError(
                    f"the router of layer {layer} is already attached to another controller; "
                    "detach that one first (one controller per model)"
                )
        self.detach()
        self._layers = tuple(layer for layer, _ in walked)
        self._routers = [router for _, router in walked]
        self._index = {id(router): i for i, router in enumerate(self._routers)}
        self._modes = [ReplayMode.OFF] * len(self._routers)
        self._attached = True  # also with zero routers: a stage of dense layers only (A6)
        for router in self._routers:
            _OWNERS[router] = self
        return self._layers

    def detach(self) -> None:
        """Release the routers (they route natively again) and drop all step state."""
        for router in self._routers:
            if _OWNERS.get(router) is self:
                del _OWNERS[router]
        self._routers, self._layers, self._index, self._modes = [], (), {}, []
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
        return self._modes[self._indices_of([layer])[0]]

    def _check_attached(self, method: str) -> None:
        if not self._attached:
            raise ReplayError(
                f"no model attached; call attach(model) before {method}() (a pipeline stage "
                "without MoE layers attaches too, and then has zero routers)"
            )

    def _indices_of(self, layers: Sequence[int]) -> list[int]:
        layers = _layer_numbers(layers, "layers")
        position = {layer: i for i, layer in enumerate(self._layers)}
        missing = [layer for layer in layers if layer not in position]
        if missing:
            raise ReplayError(f"layers {missing} have no attached router; have {self._layers}")
        return [position[layer] for layer in layers]

    # -- targets ---------------------------------------------------------------------------
    def arm(
        self,
        microbatch: Hashable,
        routes_TLK: torch.Tensor,
        *,
        layer_numbers: Sequence[int],
        replay_mask_T: torch.Tensor | None = None,
        validate: bool = True,
    ) -> None:
        """Arm replay targets for one micro-batch, rows in the router's token order.

        ``layer_numbers`` names the global layer of each slot of ``routes_TLK``; every attached
        router's layer must be among them (extra slots, e.g. dense layers of an ``all_layers``
        axis or other pipeline stages, are ignored). ``replay_mask_T`` marks rows to replay;
        the others route natively. ``validate=False`` skips the id checks for routes that were
        validated upstream; ids outside ``[0, E)`` then raise when a router replays them.
        Inputs of the wrong type, dtype or shape raise :class:`ReplayError` either way.
        """
        self._check_attached("arm")
        _check_hashable(microbatch)
        _check_routes(microbatch, routes_TLK)
        if microbatch in self._armed:
            raise ReplayError(
                f"micro-batch {microbatch!r} is still armed from an earlier pass; call "
                "end_step() (or release()) between passes so stale targets are never replayed"
            )
        key = _layer_numbers(layer_numbers, "layer_numbers")
        slot_of_router = self._slot_maps.get(key)
        if slot_of_router is None:
            slot_of_router = self._slot_maps[key] = self._slot_map(key)
        if routes_TLK.dim() != 3 or routes_TLK.shape[1:] != (len(key), self.top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes must be [T, {len(key)}, {self.top_k}] "
                f"(T, layer slots, top-k); got {list(routes_TLK.shape)}"
            )
        if replay_mask_T is not None and not isinstance(replay_mask_T, torch.Tensor):
            raise ReplayError(
                f"micro-batch {microbatch!r}: replay mask must be a bool torch.Tensor "
                f"[{routes_TLK.shape[0]}] or None; got {type(replay_mask_T).__name__}"
            )
        if replay_mask_T is not None and (
            replay_mask_T.shape != routes_TLK.shape[:1]
            or replay_mask_T.dtype != torch.bool
            or replay_mask_T.layout != torch.strided
        ):
            raise ReplayError(
                f"micro-batch {microbatch!r}: replay mask must be bool [{routes_TLK.shape[0]}]; "
                f"got {replay_mask_T.dtype} {list(replay_mask_T.shape)}"
            )
        if not isinstance(validate, bool):
            raise ReplayError(f"validate must be True or False; got {validate!r}")
        if validate:
            slot_layers = {slot: self._layers[i] for i, slot in enumerate(slot_of_router)}
            check_target_ids(
                routes_TLK,
                num_experts=self.num_experts,
                replay_mask_T=replay_mask_T,
                slot_layers=slot_layers,
                microbatch=microbatch,
            )
        consumed = [False] * len(self._routers)
        native_rows_N = None if replay_mask_T is None else (~replay_mask_T).nonzero().flatten()
        self._armed[microbatch] = _Armed(
            routes_TLK, slot_of_router, replay_mask_T, consumed, native_rows_N
        )

    def arm_batch(self, microbatch: Hashable, batch: RouteBatch) -> None:
        """Arm a validated :class:`RouteBatch` whose sequences, concatenated, are the tokens the
        routers see (packed/THD order); rows without a route go to the native router."""
        self._check_attached("arm_batch")
        if not isinstance(batch, RouteBatch):
            raise ReplayError(
                f"micro-batch {microbatch!r}: arm_batch takes a RouteBatch; got "
                f"{type(batch).__name__} (use arm() for a [T, L, K] tensor)"
            )
        meta = batch.meta
        if (meta.num_experts, meta.top_k) != (self.num_experts, self.top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes were captured with E={meta.num_experts}, "
                f"K={meta.top_k}; this model has E={self.num_experts}, K={self.top_k}"
            )
        self.arm(
            microbatch,
            batch.values_NLK,
            layer_numbers=meta.layer_numbers,
            replay_mask_T=batch.valid_N,
            validate=False,  # a RouteBatch is validated when it is built
        )

    def _slot_map(self, layer_numbers: tuple[int, ...]) -> tuple[int, ...]:
        slot = {layer: i for i, layer in enumerate(layer_numbers)}
        if len(slot) != len(layer_numbers):
            raise ReplayError(f"layer_numbers repeat a layer: {list(layer_numbers)}")
        missing = [layer for layer in self._layers if layer not in slot]
        if missing:
            raise ReplayError(
                f"routes cover layers {list(layer_numbers)} but the model has routers on layers "
                f"{missing} that they do not cover; pass the routes' true global layer numbers "
                "(an all_layers axis starts at layer 1, a moe_layers axis lists MoE layers only)"
            )
        return tuple(slot[layer] for layer in self._layers)

    def release(self, microbatch: Hashable) -> None:
        """Drop one micro-batch's targets and records without checking them."""
        _check_hashable(microbatch)
        self._armed.pop(microbatch, None)
        self._recorded.pop(microbatch, None)

    # -- micro-batch context ---------------------------------------------------------------------
    @contextmanager
    def microbatch(self, microbatch: Hashable) -> Iterator[_MicrobatchScope]:
        """Routers firing inside belong to ``microbatch``. Call ``scope.track(output)`` so a
        later backward recompute knows which micro-batch it belongs to."""
        _check_hashable(microbatch)
        previous, self._forward_mb = self._forward_mb, microbatch
        try:
            yield _MicrobatchScope(self, microbatch)
        finally:
            self._forward_mb = previous

    @contextmanager
    def backward(self, microbatch: Hashable) -> Iterator[None]:
        """Explicitly mark a backward (and its recompute) as belonging to ``microbatch``."""
        _check_hashable(microbatch)
        previous, self._backward_mb = self._backward_mb, microbatch
        try:
            yield
        finally:
            self._backward_mb = previous

    def run_microbatch(
        self, microbatch: Hashable, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """Call ``fn`` as ``microbatch`` and track every tensor of its output for backward."""
        with self.microbatch(microbatch) as scope:
            out = fn(*args, **kw)
            scope.track(out)
        return out

    def _enter_backward(self, microbatch: Hashable) -> None:
        self._backward_mb = microbatch

        def leave() -> None:
            if self._backward_mb == microbatch:
                self._backward_mb = None

        torch.autograd.Variable._execution_engine.queue_callback(leave)

    def _resolve_microbatch(self, layer: int, in_backward: bool) -> Hashable:
        if not in_backward:
            return DEFAULT_MICROBATCH if self._forward_mb is None else self._forward_mb
        if self._backward_mb is not None:
            return self._backward_mb
        if len(self._forward_mbs) == 1:
            return next(iter(self._forward_mbs))
        raise ReplayError(
            f"layer {layer} is recomputed in backward, but {len(self._forward_mbs)} micro-batches "
            f"ran forward this step ({sorted(map(repr, self._forward_mbs))}) and none is marked as "
            "the one in backward; track the forward output (microbatch(m).track / "
            "run_microbatch) or wrap the backward in controller.backward(m)"
        )

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
        if scores_TE.dim() != 2 or scores_TE.shape[1] != self.num_experts or k != self.top_k:
            raise ReplayError(
                f"layer {layer}: router gave scores {list(scores_TE.shape)} with k={k}; the "
                f"controller expects [T, {self.num_experts}] and k={self.top_k}"
            )
        in_backward = _in_backward()
        microbatch = self._resolve_microbatch(layer, in_backward)
        if not in_backward:
            self._forward_mbs.add(microbatch)
        if mode is ReplayMode.RECORD:
            return self._record(index, microbatch, in_backward, scores_TE, values_TE)
        return self._replay(index, microbatch, in_backward, scores_TE, values_TE)

    def _record(
        self,
        index: int,
        microbatch: Hashable,
        in_backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
    ) -> TopK:
        records = self._recorded.setdefault(microbatch, [None] * len(self._routers))
        recorded_TK = records[index]
        if in_backward and recorded_TK is not None:  # recompute must route as the forward did
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
        ids_TK = native_ids(scores_TE, self.top_k)
        records[index] = ids_TK
        return replay_topk(scores_TE, self.top_k, target_ids_TK=ids_TK, values_TE=values_TE)

    def _replay(
        self,
        index: int,
        microbatch: Hashable,
        in_backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
    ) -> TopK:
        layer = self._layers[index]
        armed = self._armed.get(microbatch)
        if armed is None:
            message = (
                f"layer {layer} fired in REPLAY for micro-batch {microbatch!r} but nothing is "
                f"armed for it (armed: {sorted(map(repr, self._armed))}); arm its routes first"
            )
            if self.strict:
                raise ReplayError(message)
            warnings.warn(message + "; routing natively (strict=False)", RRWarning, stacklevel=3)
            return native_topk(scores_TE, self.top_k, values_TE=values_TE)
        target_TK = armed.routes_TLK[:, armed.slot_of_router[index]]
        if target_TK.shape[0] != scores_TE.shape[0]:
            raise ReplayError(
                f"layer {layer}, micro-batch {microbatch!r}: router sees {scores_TE.shape[0]} "
                f"tokens but {target_TK.shape[0]} rows are armed; arm rows in the router's "
                "token order (after sequence-parallel scatter, context-parallel split, packing)"
            )
        measure = self.measure_agreement and not in_backward
        native_TK = native_ids(scores_TE, self.top_k) if measure else None
        try:
            out = replay_topk(
                scores_TE,
                self.top_k,
                target_ids_TK=target_TK,
                replay_mask_T=armed.mask_T,
                values_TE=values_TE,
                native_ids_TK=native_TK,
                native_rows_N=armed.native_rows_N,
            )
        except (IndexError, RuntimeError) as e:  # only unchecked (validate=False) ids get here
            bad = _unchecked_ids_error(target_TK, armed.mask_T, self.num_experts)
            if bad is None:
                raise
            raise ReplayError(f"layer {layer}, micro-batch {microbatch!r}: {bad}") from e
        if not in_backward:
            armed.consumed[index] = True
        if measure and native_TK is not None:
            agree_T = same_sets_T(out.ids_TK, native_TK)
            if armed.mask_T is None:
                hits, rows = agree_T.sum(), agree_T.numel()
                self._add_agreement(index, hits, torch.tensor(rows))
            else:
                mask_T = armed.mask_T.to(agree_T.device)
                self._add_agreement(index, (agree_T & mask_T).sum(), mask_T.sum())
        return out

    def _add_agreement(self, index: int, hits: torch.Tensor, rows: torch.Tensor) -> None:
        previous = self._agreement.get(index)
        if previous is None:
            self._agreement[index] = (hits, rows.to(hits.device))
        else:
            self._agreement[index] = (previous[0] + hits, previous[1] + rows.to(hits.device))

    def replay_mask(self, router: nn.Module) -> torch.Tensor | None:
        """The replay mask in effect for ``router``'s current call (rows marked False route
        natively), for statistics that must skip rows the rollout never routed (C4). None when
        every row is replayed, the router is not replaying, or nothing is armed."""
        index = self._index.get(id(router))
        if index is None or self._modes[index] is not ReplayMode.REPLAY:
            return None
        microbatch = self._resolve_microbatch(self._layers[index], _in_backward())
        armed = self._armed.get(microbatch)
        return None if armed is None else armed.mask_T

    # -- results and step end ------------------------------------------------------------------
    def recorded(
        self, microbatch: Hashable = DEFAULT_MICROBATCH, *, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The ids recorded for one micro-batch as ``[T, L, K]`` on the attached routers'
        layers (a ``moe_layers`` axis: ``layer_numbers`` names the slots); ``dtype`` narrows
        them on the way, in one pass."""
        _check_hashable(microbatch)
        if dtype is not None and (
            not isinstance(dtype, torch.dtype)
            or dtype not in _ID_DTYPES
            or torch.iinfo(dtype).max < self.num_experts - 1
        ):
            raise ReplayError(
                f"dtype must be an integer torch.dtype holding ids up to {self.num_experts - 1} "
                f"(num_experts={self.num_experts}); got {dtype!r}, which would change the ids"
            )
        records = self._recorded.get(microbatch)
        missing = (
            list(self._layers)
            if records is None
            else [self._layers[i] for i, r in enumerate(records) if r is None]
        )
        if records is None or missing:
            raise ReplayError(
                f"micro-batch {microbatch!r} has no record for layers {missing}; were they in "
                "RECORD mode when it ran forward?"
            )
        rows = [r for r in records if r is not None]
        if dtype is None:
            return torch.stack(rows, dim=1)
        out = torch.empty(
            (rows[0].shape[0], len(rows), self.top_k), dtype=dtype, device=rows[0].device
        )
        for i, ids_TK in enumerate(rows):
            out[:, i].copy_(ids_TK)
        return out

    def agreement(self) -> dict[int, float]:
        """Per layer, the share of replayed rows whose armed set equals the native set, this
        step so far. Layers that replayed no row are absent."""
        result = {}
        for index, (hits, rows) in sorted(self._agreement.items()):
            total = int(rows)
            if total:
                result[self._layers[index]] = int(hits) / total
        return result

    def end_step(self) -> StepReport:
        """Finish a step: report, check that every armed target was used, and clear all
        targets, records and counters (even when the check fails)."""
        report = StepReport(
            agreement=self.agreement(),
            replayed_microbatches=tuple(self._armed),
            recorded_microbatches=tuple(self._recorded),
        )
        unused = {
            mb: [self._layers[i] for i, used in enumerate(a.consumed) if not used]
            for mb, a in self._armed.items()
        }
        unused = {mb: layers for mb, layers in unused.items() if layers}
        self._reset_step()
        if unused:
            message = f"armed targets were never used (micro-batch -> layers): {unused}"
            if self.strict:
                raise ReplayError(message + "; was the router in REPLAY mode, and did it run?")
            warnings.warn(message, RRWarning, stacklevel=2)
        return report

    def _reset_step(self) -> None:
        self._armed = {}
        self._recorded = {}
        self._agreement = {}
        self._forward_mbs = set()
        self._forward_mb = None
        self._backward_mb = None


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


def _check_hashable(microbatch: object) -> None:
    try:
        hash(microbatch)
    except TypeError:
        raise ReplayError(
            f"a micro-batch id must be hashable (an int, a str, a tuple); got "
            f"{type(microbatch).__name__} {microbatch!r}"
        ) from None


def _check_routes(microbatch: Hashable, routes: object) -> None:
    """O(1) checks that ``routes`` is a dense integer tensor; the shape is checked by arm()."""
    if not isinstance(routes, torch.Tensor):
        hint = " (wrap it with torch.from_numpy)" if type(routes).__module__ == "numpy" else ""
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must be a torch.Tensor [T, L, K] of integer "
            f"expert ids; got {type(routes).__name__}{hint}"
        )
    if routes.is_nested or routes.layout != torch.strided:
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must be a dense (strided) [T, L, K] tensor; got "
            "a nested or sparse one (arm_batch takes jagged routes as a RouteBatch)"
        )
    if routes.dtype not in _ID_DTYPES:
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must hold integer expert ids (an int or uint "
            f"dtype, uint8 where E <= 256); got {routes.dtype}. Float or bool routes are not ids: "
            "convert them where they are captured, not here"
        )


def _unchecked_ids_error(
    target_TK: torch.Tensor, mask_T: torch.Tensor | None, num_experts: int
) -> str | None:
    """Why unchecked targets cannot be replayed (ids outside ``[0, E)``), or None."""
    ids_TK = target_TK.to(torch.int64)  # uint64 ids above int64 wrap negative: still flagged
    if mask_T is not None:
        ids_TK = ids_TK[mask_T.to(ids_TK.device)]
    bad = (ids_TK < 0) | (ids_TK >= num_experts)
    if not bool(bad.any()):
        return None
    lo, hi = (int(v) for v in torch.aminmax(ids_TK))
    return (
        f"armed ids span [{lo}, {hi}], outside [0, {num_experts}) ({int(bad.sum())} ids); "
        "they were armed with validate=False and never checked. Arm with validate=True, or "
        "validate the routes where they are captured"
    )


class _MicrobatchScope:
    """Handle of an open :meth:`ReplayController.microbatch` context."""

    def __init__(self, controller: ReplayController, microbatch: Hashable) -> None:
        self._controller, self.microbatch = controller, microbatch

    def track(self, output: Any) -> None:
        """Mark the grad-carrying tensors of ``output`` (nested tuples, lists, dicts): when a
        backward reaches them, recompute inside it belongs to this micro-batch.

        The mark is a pre-hook on the autograd node that produced the tensor's storage (the
        view's base for a view), not a hook on the tensor: a trainer that modifies the output in
        place afterwards (``logits.div_(temperature)`` on a view) replaces a view's own node, so
        a tensor hook would never fire, while the base's node stays in the graph."""
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                _mark_backward(output, self._controller, self.microbatch)
        elif isinstance(output, (tuple, list)):
            for item in output:
                self.track(item)
        elif isinstance(output, dict):
            for item in output.values():
                self.track(item)


def _mark_backward(tensor: torch.Tensor, controller: ReplayController, mb: Hashable) -> None:
    """Enter ``mb``'s backward when autograd reaches ``tensor``'s storage."""
    root = tensor if tensor._base is None else tensor._base
    node = root.grad_fn
    if node is None:  # a leaf: it cannot be modified in place while it requires grad
        root.register_hook(lambda grad: controller._enter_backward(mb))  # type: ignore[no-untyped-call]
        return
    node.register_prehook(lambda grads: controller._enter_backward(mb))
