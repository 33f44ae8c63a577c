"""C4: expert-bias token counts that ignore rows rr did not replay.

A replay mask marks rows that have a captured route (rows without one, e.g. padding or tokens the
engine never routed, route natively). Where the rollout never routed those rows, counting them
in the router's expert-bias statistics (``local_tokens_per_expert``) biases the load balance
towards tokens that were never served. :func:`ignore_unreplayed_rows` turns that correction on
per router; :func:`after_routing` applies it right after Megatron's own update, under the same
condition Megatron uses (expert bias on and grad enabled), on every line.

The aux-loss statistics are left to Megatron: on lines whose routing takes a ``padding_mask``
(``MegatronLine.padding_mask``, 0.16+) pass the rows as that mask to exclude them there too; the
routing hook hands the mask here only on those lines.

Shapes: T tokens, E experts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from rr_core import controller_of

_IGNORE: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def ignore_unreplayed_rows(routers: Iterable[nn.Module], enabled: bool = True) -> None:
    """Make (or stop making) the expert-bias counts of ``routers`` skip rows not replayed."""
    for router in routers:
        if enabled:
            _IGNORE[router] = True
        else:
            _IGNORE.pop(router, None)


def armed_mask_T(router: nn.Module) -> torch.Tensor | None:
    """The replay mask armed for the micro-batch this router is routing now (None: all rows
    replayed, or nothing armed)."""
    controller = controller_of(router)
    return None if controller is None else controller.replay_mask(router)


def after_routing(
    router: nn.Module, routing_map_TE: torch.Tensor, padding_mask: torch.Tensor | None = None
) -> None:
    """Take the rows outside the replay mask back out of ``local_tokens_per_expert``."""
    if not _IGNORE.get(router) or not getattr(router, "enable_expert_bias", False):
        return
    if not torch.is_grad_enabled():  # Megatron did not count this call either
        return
    mask_T = armed_mask_T(router)
    if mask_T is None:
        return
    with torch.no_grad():
        skipped_TE = routing_map_TE & ~mask_T.to(routing_map_TE.device).unsqueeze(-1)
        if padding_mask is not None:  # Megatron's own update already skipped these rows
            skipped_TE = skipped_TE & ~padding_mask.reshape(-1, 1).to(skipped_TE.device)
        counts_E: Any = router.local_tokens_per_expert
        counts_E.sub_(skipped_TE.sum(dim=0))
