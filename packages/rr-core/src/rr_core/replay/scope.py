"""Micro-batch scope: which micro-batch a router call belongs to, in forward and in the
backward recompute, whatever order the pipeline schedule runs them in (B1)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rr_core.errors import ReplayError
from rr_core.replay.modes import check_hashable
from rr_core.replay.state import DEFAULT_MICROBATCH, ControllerState


class MicrobatchScopes(ControllerState):
    """The controller's micro-batch contexts: forward scope, backward scope, resolution."""

    @contextmanager
    def microbatch(self, microbatch: Hashable) -> Iterator[MicrobatchScope]:
        """Routers firing inside belong to ``microbatch``. Call ``scope.track(output)`` so a
        later backward recompute knows which micro-batch it belongs to."""
        check_hashable(microbatch)
        previous, self._forward_mb = self._forward_mb, microbatch
        try:
            yield MicrobatchScope(self, microbatch)
        finally:
            self._forward_mb = previous

    @contextmanager
    def backward(self, microbatch: Hashable) -> Iterator[None]:
        """Explicitly mark a backward (and its recompute) as belonging to ``microbatch``."""
        check_hashable(microbatch)
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


def in_backward() -> bool:
    # -1 outside autograd's engine; recompute (reentrant or not) runs inside a backward task.
    return bool(torch._C._current_graph_task_id() != -1)


class MicrobatchScope:
    """Handle of an open :meth:`ReplayController.microbatch` context."""

    def __init__(self, controller: MicrobatchScopes, microbatch: Hashable) -> None:
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


def _mark_backward(tensor: torch.Tensor, controller: MicrobatchScopes, mb: Hashable) -> None:
    """Enter ``mb``'s backward when autograd reaches ``tensor``'s storage."""
    root = tensor if tensor._base is None else tensor._base
    node = root.grad_fn
    if node is None:  # a leaf: it cannot be modified in place while it requires grad
        root.register_hook(lambda grad: controller._enter_backward(mb))  # type: ignore[no-untyped-call]
        return
    node.register_prehook(lambda grads: controller._enter_backward(mb))
