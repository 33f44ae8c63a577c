"""Which controller owns which router. Routers of a model that was never attached to a
controller (reference, critic, teacher models: C5) have no owner and always route natively.

Owners are held by what they do at a router call (:class:`RouteOwner`), so this registry knows
nothing of the controller that fills it.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
from torch import nn

from rr_core.checks import describe
from rr_core.errors import ReplayError
from rr_core.replay.topk import TopK


class RouteOwner(Protocol):
    """What owns attached routers: it routes each of their top-k calls."""

    def route(
        self,
        router: nn.Module,
        scores_TE: torch.Tensor,
        k: int,
        *,
        values_TE: torch.Tensor | None = None,
    ) -> TopK: ...


OWNERS: weakref.WeakKeyDictionary[nn.Module, RouteOwner] = weakref.WeakKeyDictionary()


def owner_of(router: nn.Module, where: str) -> RouteOwner | None:
    """The owner of ``router``, or None; ``where`` names the caller in the error a non-module
    gets."""
    try:
        return OWNERS.get(router)
    except TypeError:  # not weakly referenceable: no module (the check costs nothing otherwise)
        raise ReplayError(
            f"{where} takes the router module (an nn.Module); got {describe(router)}"
        ) from None


def attached_router_count() -> int:
    """How many routers are attached to some controller in this process (leak checks)."""
    return len(OWNERS)
