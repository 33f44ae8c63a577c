"""Micro-batch scope: which micro-batch a router call belongs to, in forward and in the
backward recompute, whatever order the pipeline schedule runs them in (B1)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rr_core.errors import ReplayError
from rr_core.replay.checks import check_hashable

#: The micro-batch a forward belongs to when no :meth:`ReplayController.microbatch` is open.
DEFAULT_MICROBATCH = 0


class MicrobatchScopes:
    """The open forward and backward scopes and the micro-batches that ran forward this step."""

    def __init__(self) -> None:
        self._forward_mb: Hashable | None = None
        self._backward_mb: Hashable | None = None
        self._forward_mbs: set[Hashable] = set()

    @contextmanager
    def microbatch(self, microbatch: Hashable) -> Iterator[MicrobatchScope]:
        check_hashable(microbatch)
        previous, self._forward_mb = self._forward_mb, microbatch
        try:
            yield MicrobatchScope(self, microbatch)
        finally:
            self._forward_mb = previous

    @contextmanager
    def backward(self, microbatch: Hashable) -> Iterator[None]:
        check_hashable(microbatch)
        previous, self._backward_mb = self._backward_mb, microbatch
        try:
            yield
        finally:
            self._backward_mb = previous

    def enter_backward(self, microbatch: Hashable) -> None:
        """Autograd reached a tracked output of ``microbatch``: recompute belongs to it until
        this backward ends."""
        self._backward_mb = microbatch

        def leave() -> None:
            if self._backward_mb == microbatch:
                self._backward_mb = None

        torch.autograd.Variable._execution_engine.queue_callback(leave)

    def call(self, layer: int) -> tuple[Hashable, bool]:
        """``(micro-batch, in backward)`` of a router call on ``layer``; a forward call is
        remembered, so a later untracked recompute can tell which micro-batch it belongs to."""
        if torch._C._current_graph_task_id() != -1:  # in backward (see in_backward)
            return self.current(layer, True), True
        microbatch = DEFAULT_MICROBATCH if self._forward_mb is None else self._forward_mb
        self._forward_mbs.add(microbatch)
        return microbatch, False

    def current(self, layer: int, in_backward: bool) -> Hashable:
        """The micro-batch a call on ``layer`` belongs to now, remembering nothing."""
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

    def forward_microbatch(self) -> Hashable | None:
        """The micro-batch of the open forward scope, None outside any."""
        return self._forward_mb

    def reset(self) -> None:
        """A new step: no scope open, no micro-batch ran forward."""
        self._forward_mbs = set()
        self._forward_mb = None
        self._backward_mb = None


def in_backward() -> bool:
    # -1 outside autograd's engine; recompute (reentrant or not) runs inside a backward task.
    return bool(torch._C._current_graph_task_id() != -1)


class MicrobatchScope:
    """Handle of an open :meth:`ReplayController.microbatch` context."""

    def __init__(self, scopes: MicrobatchScopes, microbatch: Hashable) -> None:
        self._scopes, self.microbatch = scopes, microbatch

    def track(self, output: Any) -> None:
        """Mark the grad-carrying tensors of ``output`` (nested tuples, lists, dicts): when a
        backward reaches them, recompute inside it belongs to this micro-batch.

        The mark is a pre-hook on the autograd node that produced the tensor's storage (the
        view's base for a view), not a hook on the tensor: a trainer that modifies the output in
        place afterwards (``logits.div_(temperature)`` on a view) replaces a view's own node, so
        a tensor hook would never fire, while the base's node stays in the graph."""
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                _mark_backward(output, self._scopes, self.microbatch)
        elif isinstance(output, (tuple, list)):
            for item in output:
                self.track(item)
        elif isinstance(output, dict):
            for item in output.values():
                self.track(item)


def _mark_backward(tensor: torch.Tensor, scopes: MicrobatchScopes, mb: Hashable) -> None:
    """Enter ``mb``'s backward when autograd reaches ``tensor``'s storage."""
    root = tensor if tensor._base is None else tensor._base
    node = root.grad_fn
    if node is None:  # a leaf: it cannot be modified in place while it requires grad
        root.register_hook(lambda grad: scopes.enter_backward(mb))  # type: ignore[no-untyped-call]
        return
    node.register_prehook(lambda grads: scopes.enter_backward(mb))
