"""The one piece of a Megatron training loop rr needs: each forward step of the pipeline
schedule runs inside its micro-batch's scope, with its output tracked, so that the forward
consumes that micro-batch's targets and the backward recompute reuses them in whatever order
the schedule runs it (1F1B, interleaved 1F1B with VPP chunks).

Megatron's schedules call ``forward_step_func(data_iterator, model)`` (or with a third
argument, ``checkpoint_activations_microbatch``) once per micro-batch and model chunk, each
chunk's micro-batches in order: the n-th call for a chunk is micro-batch n.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from rr_core import ReplayController, ReplayError
from rr_megatron_compat._checks import check_controller

StepFunc = TypeVar("StepFunc", bound=Callable[..., Any])


def replay_forward_step(
    controller: ReplayController,
    forward_step_func: StepFunc,
    *,
    microbatches: Sequence[Hashable] | None = None,
) -> StepFunc:
    """``forward_step_func`` for one call of Megatron's ``forward_backward_func``, each call
    run as its micro-batch of ``controller``: the n-th forward of each model chunk is
    micro-batch ``n``, or ``microbatches[n]`` when the targets were armed under other ids.
    Wrap it anew for every step (the count starts at 0). The wrapper keeps the function's
    signature (``functools.wraps``)."""
    check_controller(controller, "replay_forward_step")
    if not callable(forward_step_func):
        raise ReplayError(
            "forward_step_func must be Megatron's forward step, called as (data_iterator, "
            f"model); got {type(forward_step_func).__name__}"
        )
    ids = None if microbatches is None else tuple(microbatches)
    calls: dict[int, int] = {}  # id(model chunk) -> forwards run so far this step

    @functools.wraps(forward_step_func)
    def forward_step(data_iterator: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        n = calls.get(id(model), 0)
        if ids is not None and n >= len(ids):
            raise ReplayError(
                f"forward {n + 1} of a model chunk, but micro-batch ids were given for "
                f"{len(ids)} ({list(ids)!r:.200}); pass one id per micro-batch of the step, or "
                "wrap the forward step anew for each step"
            )
        calls[id(model)] = n + 1
        with controller.microbatch(n if ids is None else ids[n]) as scope:
            result = forward_step_func(data_iterator, model, *args, **kwargs)
            scope.track(result)  # (output, loss_func): the output's tensors
        return result

    return forward_step  # type: ignore[return-value]
