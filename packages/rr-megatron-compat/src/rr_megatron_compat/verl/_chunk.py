"""One :class:`rr_core.ReplayController` per attached model chunk (see
:mod:`rr_megatron_compat.verl`).

A chunk is attached the first time it is handed to a function of the verl layer; its forward runs
as a fresh micro-batch of its controller (a forward pre-hook opens ``controller.microbatch(m)``
and arms what was staged; the forward hook tracks the output), so Megatron's backward recompute
finds the same targets whatever the schedule order. Nothing here holds a model chunk strongly:
a chunk whose model is dropped detaches itself when the model is collected.

Shapes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode, walk_routers
from rr_core.replay.walk import is_router_by_name
from rr_megatron_compat.verl._names import NAMES
from rr_megatron_compat.verl._views import (
    _BUILT,
    _CHUNKS,
    _VIEWS,
    RouterReplay,
    RouterReplayAction,
    _mode,
    view_of,
)


class _Chunk:
    """One attached model chunk: its controller, router views and micro-batch bookkeeping."""

    def __init__(self, module: nn.Module) -> None:
        walked = walk_routers(module, is_router=_is_router)
        config: Any = getattr(walked[0][1] if walked else module, "config", None)
        experts = int(getattr(config, "num_moe_experts", None) or 1)
        topk = int(getattr(walked[0][1], "topk", 1)) if walked else 1
        # verl's API has no place to read agreement: skip measuring it (a native top-k per layer)
        self.controller = ReplayController(num_experts=experts, top_k=topk, measure_agreement=False)
        self.attached = False
        self.layers = tuple(number for number, _ in walked)
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
        # Routers with a config are attached now (a config rr cannot replay raises here);
        # stand-ins without one (a test's router) and router-less chunks on the first forward:
        # targets and actions can be set on them, and the checks still run before any routing.
        if walked and all(hasattr(router, "config") for _, router in walked):
            self._attach(module)

    def _attach(self, module: nn.Module) -> None:
        import rr_megatron_compat

        rr_megatron_compat.attach(self.controller, module)
        self.attached, self.mode = True, ReplayMode.OFF
        self.apply_actions()

    # -- actions -------------------------------------------------------------------------------
    def apply_actions(self) -> None:
        """Give the controller the views' actions: one ``set_mode`` when they agree."""
        if not self.attached:  # the views hold the actions until the first forward attaches
            return
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
        if not self.attached:  # the views hold the actions until the first forward attaches
            return
        if mode is not self.mode or len(self.views) == 0:
            self.controller.set_mode(mode)
            self.mode = mode

    def action(self) -> RouterReplayAction | str | None:
        """The action all routers share, or ``"mixed"``."""
        actions = {view.router_replay_action for view in self.views}
        return next(iter(actions)) if len(actions) == 1 else "mixed"

    # -- forward -------------------------------------------------------------------------------
    def _enter(self, module: nn.Module, args: Any) -> None:
        if not self.attached:
            self._attach(module)
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
        if self.attached:
            self.controller.detach()
            self.attached = False


def _is_router(module: nn.Module) -> bool:
    """rr's rule (a class named ``...Router``), or an instance of the class verl's module calls
    ``TopKRouter`` when something replaced it there (Megatron's is never imported for this)."""
    if is_router_by_name(module):
        return True
    cls = NAMES.replaced_router_class()
    return isinstance(cls, type) and isinstance(module, cls)


def _same_mask(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a.bool().cpu(), b.bool().cpu()))


def chunks_of(model: nn.Module | Sequence[nn.Module]) -> list[_Chunk]:
    """The attached chunk of each module of ``model`` (a module or its VPP chunks), attaching
    on first use with the routers' current actions."""
    modules: Iterable[nn.Module] = (
        model if isinstance(model, (list, tuple)) else [model]  # type: ignore[list-item]
    )
    out = []
    for module in modules:
        chunk = _CHUNKS.get(module)
        if not isinstance(chunk, _Chunk):  # not attached yet (only _Chunks are registered)
            chunk = _Chunk(module)
            _CHUNKS[module] = chunk
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
