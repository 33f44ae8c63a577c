"""Which controller owns which router: the hook point routers call at their top-k step.

Routers of a model that was never attached to a controller (reference, critic, teacher
models: C5) always route natively.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn

from rr_core.checks import describe
from rr_core.errors import ReplayError
from rr_core.replay.topk import TopK, native_topk

if TYPE_CHECKING:
    from rr_core.replay.controller import ReplayController

OWNERS: weakref.WeakKeyDictionary[nn.Module, ReplayController] = weakref.WeakKeyDictionary()


def router_topk(
    router: nn.Module, scores_TE: torch.Tensor, k: int, *, values_TE: torch.Tensor | None = None
) -> TopK:
    """The hook point routers call at their top-k step: native top-k unless ``router`` belongs
    to an attached controller whose mode for it is not OFF."""
    controller = _owner(router, "router_topk")
    if controller is None:
        return native_topk(scores_TE, k, values_TE=values_TE)
    return controller.route(router, scores_TE, k, values_TE=values_TE)


def controller_of(router: nn.Module) -> ReplayController | None:
    """The controller a router is attached to, if any."""
    return _owner(router, "controller_of")


def _owner(router: nn.Module, where: str) -> ReplayController | None:
    try:
        return OWNERS.get(router)
    except TypeError:  # not weakly referenceable: no module (the check costs nothing otherwise)
        raise ReplayError(
            f"{where} takes the router module (an nn.Module); got {describe(router)}"
        ) from None


def attached_router_count() -> int:
    """How many routers are attached to some controller in this process (leak checks)."""
    return len(OWNERS)
