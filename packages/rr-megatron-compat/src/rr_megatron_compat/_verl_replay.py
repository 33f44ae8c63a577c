"""verl's ``RouterReplay`` / ``RouterReplayAction`` backed by one :class:`rr_core.ReplayController`
per model chunk (see :mod:`rr_megatron_compat.verl`).

Shapes: T tokens, L layer slots, K top-k.

Every router has at most one :class:`RouterReplay` view, which refers to its router weakly. A
chunk is attached the first time it is handed to a function of the verl layer; its forward runs
as a fresh micro-batch of its controller (a forward pre-hook opens ``controller.microbatch(m)``
and arms what was staged; the forward hook tracks the output), so Megatron's backward recompute
finds the same targets whatever the schedule order. Nothing here holds a model chunk strongly:
a chunk whose model is dropped detaches itself when the model is collected.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode, walk_routers


class RouterReplayAction(enum.Enum):
    """verl's actions. Both replay actions are rr's ``ReplayMode.REPLAY``: which micro-batch a
    router replays (forward or backward recompute) comes from the micro-batch key, not from the
    action."""

    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


def _mode(action: RouterReplayAction | None) -> ReplayMode:
    if action is None:
        return ReplayMode.OFF
    if not isinstance(action, RouterReplayAction):
        raise ReplayError(f"expected a RouterReplayAction or None; got {action!r}")
    return ReplayMode.RECORD if action is RouterReplayAction.RECORD else ReplayMode.REPLAY


#: routers built with replay enabled while the patch is applied, in creation order (weakly)
_BUILT: dict[int, weakref.ref[nn.Module]] = {}
#: each router's view, and each attached module's chunk (both keyed weakly)
_VIEWS: weakref.WeakKeyDictionary[nn.Module, RouterReplay] = weakref.WeakKeyDictionary()
_CHUNKS: weakref.WeakKeyDictionary[nn.Module, _Chunk] = weakref.WeakKeyDictionary()


def replay_enabled(config: Any) -> bool:
    """Whether a router gets a RouterReplay: verl's rule (either config flag), and on lines
    without native replay (0.12 - 0.15) every router, since rr's hooks need no flag there."""
    from rr_megatron_compat._versions import megatron_line

    return bool(
        getattr(config, "enable_routing_replay", False)
        or getattr(config, "moe_enable_routing_replay", False)
        or not megatron_line().native_replay
    )


def register_router(router: nn.Module) -> None:
    """Remember a router built while the patch is applied (verl lists those in
    ``router_instances``); forgotten when the router is collected."""
    if replay_enabled(getattr(router, "config", None)):
        key = id(router)
        _BUILT[key] = weakref.ref(router, lambda _ref: _BUILT.pop(key, None))


def view_of(router: nn.Module) -> RouterReplay:
    """The one view of ``router`` (created on first use)."""
    view = _VIEWS.get(router)
    if view is None:
        view = _VIEWS[router] = RouterReplay._bind(router)
    return view


class _Chunk:
    """One attached model chunk: its controller, router views and micro-batch bookkeeping."""

    def __init__(self, module: nn.Module) -> None:
        from rr_megatron_compat._attach import attach

        walked = walk_routers(module)
        config: Any = getattr(walked[0][1] if walked else module, "config", None)
        experts = int(getattr(config, "num_moe_experts", None) or 1)
        topk = int(getattr(walked[0][1], "topk", 1)) if walked else 1
        # verl's API has no place to read agreement: skip measuring it (a native top-k per layer)
        self.controller = ReplayController(num_experts=experts, top_k=topk, measure_agreement=False)
        attach(self.controller, module)
        self.layers = self.controller.layer_numbers
        self.views = [view_of(router) for _, router in walked]
        self.staged: dict[int, torch.Tensor] = {}
        self.staged_rows: tuple[torch.Tensor, tuple[int, ...]] | None = None
        self.staged_mask: torch.Tensor | None = None
        self.next_mb = 0
        self.last_mb: int | None = None
        self.records: dict[Hashable, torch.Tensor] = {}
        self.mode = ReplayMode.OFF
        self.open: list[tuple[Any, Any]] = []
        self.handles = [
            module.register_forward_pre_hook(self._enter),
            module.register_forward_hook(self._leave, always_call=True),
        ]
        for view in self.views:
            view._chunk = self
        weakref.finalize(module, self.detach)

    # -- actions -------------------------------------------------------------------------------
    def apply_actions(self) -> None:
        """Give the controller the views' actions: one ``set_mode`` when they agree."""
        actions = {view.router_replay_action for view in self.views}
        if len(actions) == 1:
            self.set_mode(_mode(next(iter(actions))))
            return
        self.mode = ReplayMode.OFF  # mixed: per layer
        for view in self.views:
            self.controller.set_mode(_mode(view.router_replay_action), layers=[view.layer_number])

    def set_action(self, action: RouterReplayAction | None) -> None:
        for view in self.views:
            view.router_replay_action = action
        self.set_mode(_mode(action))

    def set_mode(self, mode: ReplayMode) -> None:
        if mode is not self.mode or len(self.views) == 0:
            self.controller.set_mode(mode)
            self.mode = mode

    def action(self) -> RouterReplayAction | str | None:
        """The action all routers share, or ``"mixed"``."""
        actions = {view.router_replay_action for view in self.views}
        return next(iter(actions)) if len(actions) == 1 else "mixed"

    # -- forward -------------------------------------------------------------------------------
    def _enter(self, module: nn.Module, args: Any) -> None:
        mb, self.next_mb = self.next_mb, self.next_mb + 1
        if self.staged_rows is not None or self.staged:
            rows, layers = self._take_staged()
            mask, self.staged_mask = self.staged_mask, None
            self.controller.arm(mb, rows, layer_numbers=layers, replay_mask_T=mask)
        scope = self.controller.microbatch(mb)
        self.open.append((scope, scope.__enter__()))
        self.last_mb = mb

    def _take_staged(self) -> tuple[torch.Tensor, tuple[int, ...]]:
        if self.staged_rows is not None:
            (rows, layers), self.staged_rows = self.staged_rows, None
            return rows, layers
        missing = [n for n in self.layers if n not in self.staged]
        if missing:
            raise ReplayError(f"replay targets staged without layers {missing} of this chunk")
        rows = torch.stack([self.staged[n] for n in self.layers], dim=1)
        self.staged = {}
        return rows, self.layers

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        scope, handle = self.open.pop()
        try:
            if torch.is_grad_enabled():
                handle.track(output)
        finally:
            scope.__exit__(None, None, None)

    # -- targets and records -------------------------------------------------------------------
    def stage(self, layer: int, ids_TK: torch.Tensor, mask_T: torch.Tensor | None) -> None:
        """Targets of one layer for the next forward (verl's per-router ``set_target_indices``)."""
        if layer in self.staged or self.staged_rows is not None:
            raise ReplayError(
                f"layer {layer} already has targets staged for the next forward; targets are "
                "per micro-batch, set them once before each forward"
            )
        if self.staged and not _same_mask(self.staged_mask, mask_T):
            raise ReplayError("layers of one micro-batch were given different replay masks")
        self.staged[layer] = ids_TK
        self.staged_mask = None if mask_T is None else mask_T.bool()

    def stage_rows(
        self, rows_TLK: torch.Tensor, layers: tuple[int, ...], mask_T: torch.Tensor | None
    ) -> None:
        """Targets of every layer at once, the routes' slots named by ``layers``."""
        if self.staged or self.staged_rows is not None:
            raise ReplayError(
                f"layers {list(self.layers)} already have targets staged for the next forward; "
                "targets are per micro-batch, set them once before each forward"
            )
        self.staged_rows, self.staged_mask = (rows_TLK, layers), mask_T

    def staged_target(self, layer: int) -> torch.Tensor | None:
        if self.staged_rows is not None:
            rows, layers = self.staged_rows
            return rows[:, layers.index(layer)]
        return self.staged.get(layer)

    def recorded_last(self) -> torch.Tensor | None:
        """``[T, L, K]`` recorded in the last forward (stacked once per micro-batch)."""
        mb = self.last_mb
        if mb is None:
            return None
        rows = self.records.get(mb)
        if rows is None:
            try:
                rows = self.records[mb] = self.controller.recorded(mb, dtype=torch.int16)
            except ReplayError:
                return None
        return rows

    def end_step(self) -> None:
        self.staged, self.staged_rows, self.staged_mask = {}, None, None
        self.next_mb, self.last_mb, self.records = 0, None, {}
        self.controller.end_step()

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for view in self.views:
            if view._chunk is self:
                view._chunk = None
        self.controller.detach()


def _same_mask(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a.bool().cpu(), b.bool().cpu()))


class _LiveViews:
    """``RouterReplay.router_instances``: the views of the routers alive now (built with replay
    enabled while the patch is applied, or attached), in creation order. A fresh list each time:
    mutating it changes nothing."""

    def __get__(self, instance: Any, owner: Any) -> list[RouterReplay]:
        routers = [ref() for ref in list(_BUILT.values())]
        for chunk in list(_CHUNKS.values()):
            routers.extend(view.router for view in chunk.views)
        seen: set[int] = set()
        views = []
        for router in routers:
            if router is not None and id(router) not in seen:
                seen.add(id(router))
                views.append(view_of(router))
        return views


class RouterReplay:
    """verl's per-router replay object, here a view of one router (weakly referenced) and, once
    its model is used through the verl layer, of the rr controller that drives it."""

    router_instances: ClassVar[list[RouterReplay]] = _LiveViews()  # type: ignore[assignment]
    _global_action: ClassVar[RouterReplayAction | None] = None

    _router: weakref.ref[nn.Module]
    _chunk: _Chunk | None
    router_replay_action: RouterReplayAction | None

    def __init__(self) -> None:
        raise TypeError(
            "rr creates one RouterReplay view per router (router.router_replay, "
            "RouterReplay.router_instances, iter_model_routers(model)); do not construct them"
        )

    @classmethod
    def _bind(cls, router: nn.Module) -> RouterReplay:
        view = cls.__new__(cls)
        view._router, view._chunk = weakref.ref(router), None
        view.router_replay_action = cls._global_action
        return view

    @property
    def router(self) -> nn.Module:
        router = self._router()
        if router is None:
            raise ReplayError("this RouterReplay's router has been garbage-collected")
        return router

    @property
    def layer_number(self) -> int:
        return int(getattr(self.router, "layer_number", 0) or 0)

    def _driven(self, what: str) -> _Chunk:
        if self._chunk is None:
            raise ReplayError(
                f"RouterReplay.{what}: the router of layer {self.layer_number} belongs to no "
                "model rr drives yet; hand the forwarded model to rr first "
                "(set_router_replay_data(..., model=model) or iter_model_routers(model))"
            )
        return self._chunk

    def __repr__(self) -> str:
        return f"RouterReplay(layer {self.layer_number}, {self.router_replay_action})"

    # -- global (every live router) ------------------------------------------------------------
    @staticmethod
    def set_replay_data(all_layers_topk_indices: list[Any]) -> None:
        """Refused: positional targets for a process-wide router list; use
        ``set_router_replay_data(..., model=model)``."""
        raise ReplayError(
            "RouterReplay.set_replay_data addresses routers by position in a process-wide "
            "list; rr addresses them by layer number: use set_router_replay_data(model=...)"
        )

    @staticmethod
    def get_recorded_data() -> list[torch.Tensor | None]:
        """Each live router's record of its chunk's last forward, in ``router_instances``
        order (None where nothing was recorded)."""
        return [view.get_recorded_indices() for view in RouterReplay.router_instances]

    @staticmethod
    def clear_global_indices() -> None:
        """End the step of every attached chunk: check every armed target was used (raises
        otherwise), then drop targets, records and micro-batch numbering."""
        errors = []
        for chunk in list(_CHUNKS.values()):
            try:
                chunk.end_step()
            except ReplayError as error:
                errors.append(str(error))
        if errors:
            raise ReplayError("; ".join(errors))

    @staticmethod
    def set_global_router_replay_action(router_replay_action: RouterReplayAction) -> None:
        """Set the action of every live router, and of routers used later."""
        _mode(router_replay_action)
        RouterReplay._global_action = router_replay_action
        _set_all(router_replay_action)

    @staticmethod
    def clear_global_router_replay_action() -> None:
        RouterReplay._global_action = None
        _set_all(None)

    # -- one router ----------------------------------------------------------------------------
    @property
    def target_topk_idx(self) -> torch.Tensor | None:
        """``[T, K]`` ids this router replays in its chunk's next forward (staged), else in
        the last one; None when nothing is armed."""
        chunk = self._chunk
        if chunk is None:
            return None
        staged = chunk.staged_target(self.layer_number)
        if staged is not None or chunk.last_mb is None:
            return staged
        armed = chunk.controller._armed.get(chunk.last_mb)
        if armed is None:
            return None
        index = chunk.layers.index(self.layer_number)
        return armed.routes_TLK[:, armed.slot_of_router[index]]

    @property
    def recorded_topk_idx(self) -> torch.Tensor | None:
        """verl's attribute: :meth:`get_recorded_indices`."""
        return self.get_recorded_indices()

    def set_target_indices(
        self, topk_indices: torch.Tensor, replay_mask: torch.Tensor | None = None
    ) -> None:
        """Stage ``[T, K]`` targets of this layer for the chunk's next forward (one micro-batch);
        all layers of the chunk must be staged, with one mask, before that forward."""
        self._driven("set_target_indices").stage(self.layer_number, topk_indices, replay_mask)

    def get_recorded_indices(self) -> torch.Tensor | None:
        """``[T, K]`` ids this router recorded in its chunk's last forward, or ``None``."""
        chunk = self._chunk
        rows = None if chunk is None else chunk.recorded_last()
        if chunk is None or rows is None:
            return None
        return rows[:, chunk.layers.index(self.layer_number)]

    def record_indices(self, topk_indices: torch.Tensor) -> None:
        """Refused: rr records inside the router's top-k step."""
        raise ReplayError(
            "RouterReplay.record_indices is verl's hook inside its patched routing; rr records "
            "in the router's own top-k step: set RouterReplayAction.RECORD and read "
            "get_recorded_indices() or merge_router_topk_indices(..., model=model)"
        )

    def get_replay_topk(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: rr selects the top-k inside Megatron's router through its own hooks."""
        raise ReplayError(
            "RouterReplay.get_replay_topk is verl's hook inside its patched routing; under rr "
            "Megatron's router calls rr's hook itself. Stage targets with "
            "set_router_replay_data(..., model=model) and run the model's forward"
        )

    def clear_indices(self) -> None:
        """Ends the step of this router's whole chunk (see :meth:`clear_global_indices`)."""
        if self._chunk is not None:
            self._chunk.end_step()

    def set_router_replay_action(self, router_replay_action: RouterReplayAction) -> None:
        _mode(router_replay_action)
        self.router_replay_action = router_replay_action
        if self._chunk is not None:
            self._chunk.apply_actions()

    def clear_router_replay_action(self) -> None:
        self.router_replay_action = None
        if self._chunk is not None:
            self._chunk.apply_actions()


def _set_all(action: RouterReplayAction | None) -> None:
    for view in list(_VIEWS.values()):
        view.router_replay_action = action
    for chunk in list(_CHUNKS.values()):
        chunk.set_mode(_mode(action))


def chunks_of(model: nn.Module | Sequence[nn.Module]) -> list[_Chunk]:
    """The attached chunk of each module of ``model`` (a module or its VPP chunks), attaching
    on first use with the routers' current actions."""
    modules: Iterable[nn.Module] = (
        model if isinstance(model, (list, tuple)) else [model]  # type: ignore[list-item]
    )
    out = []
    for module in modules:
        chunk = _CHUNKS.get(module)
        if chunk is None:
            chunk = _CHUNKS[module] = _Chunk(module)
            chunk.apply_actions()
        out.append(chunk)
    return out


def attached_views() -> list[RouterReplay]:
    """Views of the routers of every attached chunk."""
    return [view for chunk in list(_CHUNKS.values()) for view in chunk.views]


def release_all() -> None:
    """Detach every chunk and forget the built routers and the global action."""
    for chunk in list(_CHUNKS.values()):
        chunk.detach()
    _CHUNKS.clear()
    _BUILT.clear()
    RouterReplay._global_action = None
    for view in list(_VIEWS.values()):
        view.router_replay_action = None
