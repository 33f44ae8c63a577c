"""verl's ``RouterReplay`` / ``RouterReplayAction``: one view per router (see
:mod:`rr_megatron_compat.verl`).

Every router has at most one :class:`RouterReplay` view, which refers to its router weakly; once
the router's model chunk is attached (:mod:`rr_megatron_compat.verl._chunk`) the view reads and
stages through that chunk's :class:`rr_core.ReplayController`. Shapes: T tokens, K top-k.
"""

from __future__ import annotations

import enum
import weakref
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode


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


class DrivingChunk(Protocol):
    """What a view uses of the attached chunk that drives its router
    (:class:`rr_megatron_compat.verl._chunk._Chunk`), stated here so that this module, which the
    chunk builds on, does not import the chunk's."""

    views: list[RouterReplay]
    layers: tuple[int, ...]
    controller: ReplayController
    last_mb: int | None

    def apply_actions(self) -> None: ...

    def set_mode(self, mode: ReplayMode) -> None: ...

    def stage(self, layer: int, ids_TK: torch.Tensor, mask_T: torch.Tensor | None) -> None: ...

    def staged_target(self, layer: int) -> torch.Tensor | None: ...

    def recorded_last(self) -> torch.Tensor | None: ...

    def end_step(self) -> None: ...

    def detach(self) -> None: ...


#: routers built with replay enabled while the patch is applied, in creation order (weakly)
_BUILT: dict[int, weakref.ref[nn.Module]] = {}
#: RouterReplay() objects constructed by hand (verl's routers build one each), until a walk
#: finds them on a router; in creation order, weakly
_UNBOUND: weakref.WeakValueDictionary[int, RouterReplay] = weakref.WeakValueDictionary()
#: each router's view, and each attached module's chunk (both keyed weakly)
_VIEWS: weakref.WeakKeyDictionary[nn.Module, RouterReplay] = weakref.WeakKeyDictionary()
_CHUNKS: weakref.WeakKeyDictionary[nn.Module, DrivingChunk] = weakref.WeakKeyDictionary()


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
    """The one view of ``router``: the ``RouterReplay()`` the router built for itself
    (``self.router_replay = RouterReplay()``, as verl's routers do), else one rr creates."""
    view = _VIEWS.get(router)
    if view is None:
        own = vars(router).get("router_replay")
        if isinstance(own, RouterReplay) and own._router is None:
            _UNBOUND.pop(id(own), None)
            own._router = weakref.ref(router)
            view = own
        else:
            view = RouterReplay._bind(router)
        _VIEWS[router] = view
    return view


class _LiveViews:
    """``RouterReplay.router_instances``: the views of the routers alive now (built with replay
    enabled while the patch is applied, or attached), in creation order, then the constructed
    ones no walk has found on a router yet (verl's orphans: they never replay). A fresh list
    each time: mutating it changes nothing."""

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
        return views + list(_UNBOUND.values())


class RouterReplay:
    """verl's per-router replay object, here a view of one router (weakly referenced) and, once
    its model is used through the verl layer, of the rr controller that drives it."""

    router_instances: ClassVar[list[RouterReplay]] = _LiveViews()  # type: ignore[assignment]
    _global_action: ClassVar[RouterReplayAction | None] = None

    _router: weakref.ref[nn.Module] | None
    _chunk: DrivingChunk | None
    router_replay_action: RouterReplayAction | None

    def __init__(self) -> None:
        """A view of no router yet, as verl's routers build one in ``__init__``; the first walk
        of a model that finds it as a router's ``router_replay`` binds it to that router."""
        self._router, self._chunk = None, None
        self.router_replay_action = None
        _UNBOUND[id(self)] = self

    @classmethod
    def _bind(cls, router: nn.Module) -> RouterReplay:
        view = cls.__new__(cls)
        view._router, view._chunk = weakref.ref(router), None
        view.router_replay_action = cls._global_action
        return view

    @property
    def router(self) -> nn.Module:
        if self._router is None:
            raise ReplayError(
                "this RouterReplay belongs to no router: no walked model has it as a router's "
                "router_replay"
            )
        router = self._router()
        if router is None:
            raise ReplayError("this RouterReplay's router has been garbage-collected")
        return router

    @property
    def layer_number(self) -> int:
        return int(getattr(self.router, "layer_number", 0) or 0)

    def _driven(self, what: str) -> DrivingChunk:
        if self._chunk is None:
            raise ReplayError(
                f"RouterReplay.{what}: the router of layer {self.layer_number} belongs to no "
                "model rr drives yet; hand the forwarded model to rr first "
                "(set_router_replay_data(..., model=model) or iter_model_routers(model))"
            )
        return self._chunk

    def __repr__(self) -> str:
        where = "no router" if self._router is None else f"layer {self.layer_number}"
        return f"RouterReplay({where}, {self.router_replay_action})"

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
    for view in [*_VIEWS.values(), *_UNBOUND.values()]:
        view.router_replay_action = action
    for chunk in list(_CHUNKS.values()):
        chunk.set_mode(_mode(action))
