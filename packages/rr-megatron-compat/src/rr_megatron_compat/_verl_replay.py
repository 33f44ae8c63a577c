"""verl's ``RouterReplay`` / ``RouterReplayAction`` backed by one :class:`rr_core.ReplayController`
per model chunk (see :mod:`rr_megatron_compat.verl`).

A chunk is attached the first time it is handed to a function of the verl layer. Its forward
runs as a fresh micro-batch of its controller (a forward pre-hook opens
``controller.microbatch(m)``; the forward hook tracks the output), so targets staged before the
forward are armed for exactly that micro-batch and Megatron's backward recompute finds them
again through the tracked output, whatever the schedule order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
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


class _Chunk:
    """One attached model chunk: its controller, router views and micro-batch bookkeeping."""

    def __init__(self, module: nn.Module) -> None:
        from rr_megatron_compat._attach import attach

        walked = walk_routers(module)
        config: Any = getattr(walked[0][1] if walked else module, "config", None)
        experts = int(getattr(config, "num_moe_experts", None) or 1)
        topk = int(getattr(walked[0][1], "topk", 1)) if walked else 1
        self.module = module
        self.controller = ReplayController(num_experts=experts, top_k=topk)
        attach(self.controller, module)
        self.views = [RouterReplay._bind(self, layer) for layer in self.controller.layer_numbers]
        self.staged: dict[int, torch.Tensor] = {}
        self.staged_mask: torch.Tensor | None = None
        self.next_mb = 0
        self.last_mb: int | None = None
        self.open: list[tuple[Any, Any]] = []
        self.handles = [
            module.register_forward_pre_hook(self._enter),
            module.register_forward_hook(self._leave, always_call=True),
        ]

    def _enter(self, module: nn.Module, args: Any) -> None:
        mb, self.next_mb = self.next_mb, self.next_mb + 1
        if self.staged:
            layers = self.controller.layer_numbers
            missing = [n for n in layers if n not in self.staged]
            if missing:
                raise ReplayError(f"replay targets staged without layers {missing} of this chunk")
            routes = torch.stack([self.staged[n] for n in layers], dim=1)
            mask, self.staged, self.staged_mask = self.staged_mask, {}, None
            self.controller.arm(mb, routes, layer_numbers=layers, replay_mask_T=mask)
        scope = self.controller.microbatch(mb)
        self.open.append((scope, scope.__enter__()))
        self.last_mb = mb

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        scope, handle = self.open.pop()
        try:
            if torch.is_grad_enabled():
                handle.track(output)
        finally:
            scope.__exit__(None, None, None)

    def stage(self, layer: int, ids_TK: torch.Tensor, mask_T: torch.Tensor | None) -> None:
        if layer in self.staged:
            raise ReplayError(
                f"layer {layer} already has targets staged for the next forward; targets are "
                "per micro-batch, set them once before each forward"
            )
        if self.staged and not _same_mask(self.staged_mask, mask_T):
            raise ReplayError("layers of one micro-batch were given different replay masks")
        self.staged[layer] = ids_TK.to(torch.int64)
        self.staged_mask = None if mask_T is None else mask_T.bool()

    def end_step(self) -> None:
        self.staged, self.staged_mask, self.next_mb, self.last_mb = {}, None, 0, None
        self.controller.end_step()

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.controller.detach()


def _same_mask(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a.bool().cpu(), b.bool().cpu()))


class RouterReplay:
    """verl's per-router replay object, here a view of one attached router (its chunk and
    global layer number). rr creates the views when a model is first used; ``router_instances``
    lists the views of attached models only, so routers of discarded models never appear (A1)."""

    router_instances: ClassVar[list[RouterReplay]] = []
    _chunks: ClassVar[dict[int, _Chunk]] = {}
    _global_action: ClassVar[RouterReplayAction | None] = None

    _chunk: _Chunk
    layer_number: int
    router_replay_action: RouterReplayAction | None

    def __init__(self) -> None:
        raise TypeError(
            "rr creates RouterReplay views when a model is first used (iter_model_routers, "
            "set_model_router_replay_action, set_router_replay_data); do not construct them"
        )

    @classmethod
    def _bind(cls, chunk: _Chunk, layer: int) -> RouterReplay:
        view = cls.__new__(cls)
        view._chunk, view.layer_number, view.router_replay_action = chunk, layer, None
        return view

    # -- global (all attached models) ----------------------------------------------------------
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
        """Each attached router's record of its chunk's last forward, in ``router_instances``
        order."""
        return [view.get_recorded_indices() for view in RouterReplay.router_instances]

    @staticmethod
    def clear_global_indices() -> None:
        """End the step of every attached chunk: check every armed target was used (raises
        otherwise), then drop targets, records and micro-batch numbering."""
        errors = []
        for chunk in list(RouterReplay._chunks.values()):
            try:
                chunk.end_step()
            except ReplayError as error:
                errors.append(str(error))
        if errors:
            raise ReplayError("; ".join(errors))

    @staticmethod
    def set_global_router_replay_action(router_replay_action: RouterReplayAction) -> None:
        """Set the action of every attached router, and of models attached later."""
        _mode(router_replay_action)
        RouterReplay._global_action = router_replay_action
        for view in RouterReplay.router_instances:
            view.set_router_replay_action(router_replay_action)

    @staticmethod
    def clear_global_router_replay_action() -> None:
        RouterReplay._global_action = None
        for view in RouterReplay.router_instances:
            view.clear_router_replay_action()

    # -- one router --------------------------------------------------------------------------
    def set_target_indices(
        self, topk_indices: torch.Tensor, replay_mask: torch.Tensor | None = None
    ) -> None:
        """Stage ``[T, K]`` targets of this layer for the chunk's next forward (one micro-batch);
        all layers of the chunk must be staged, with one mask, before that forward."""
        self._chunk.stage(self.layer_number, topk_indices, replay_mask)

    def get_recorded_indices(self) -> torch.Tensor | None:
        """``[T, K]`` ids this router recorded in its chunk's last forward, or ``None``."""
        chunk = self._chunk
        if chunk.last_mb is None:
            return None
        try:
            routes = chunk.controller.recorded(chunk.last_mb)
        except ReplayError:
            return None
        return routes[:, chunk.controller.layer_numbers.index(self.layer_number)]

    def clear_indices(self) -> None:
        """Ends the step of this router's whole chunk (see :meth:`clear_global_indices`)."""
        self._chunk.end_step()

    def set_router_replay_action(self, router_replay_action: RouterReplayAction) -> None:
        self._chunk.controller.set_mode(_mode(router_replay_action), layers=[self.layer_number])
        self.router_replay_action = router_replay_action

    def clear_router_replay_action(self) -> None:
        self._chunk.controller.set_mode(ReplayMode.OFF, layers=[self.layer_number])
        self.router_replay_action = None


def chunks_of(model: nn.Module | Sequence[nn.Module]) -> list[_Chunk]:
    """The attached chunk of each module of ``model`` (a module or its VPP chunks), attaching
    on first use with the current global action."""
    modules: Iterable[nn.Module] = (
        model if isinstance(model, (list, tuple)) else [model]  # type: ignore[list-item]
    )
    out = []
    for module in modules:
        chunk = RouterReplay._chunks.get(id(module))
        if chunk is None or chunk.module is not module:
            chunk = RouterReplay._chunks[id(module)] = _Chunk(module)
            RouterReplay.router_instances.extend(chunk.views)
            if RouterReplay._global_action is not None:
                for view in chunk.views:
                    view.set_router_replay_action(RouterReplay._global_action)
        out.append(chunk)
    return out


def release_all() -> None:
    """Detach every chunk, remove the hooks and forget the views and the global action."""
    for chunk in RouterReplay._chunks.values():
        chunk.detach()
    RouterReplay._chunks.clear()
    RouterReplay.router_instances.clear()
    RouterReplay._global_action = None
