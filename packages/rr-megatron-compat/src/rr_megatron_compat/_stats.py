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

G1: on 0.16 - 0.19.2 Megatron's own update (``TopKRouter._apply_expert_bias``) combines the
routing map ``[T, E]`` with ``~padding_mask`` ``[T]`` without ``unsqueeze`` (Megatron #6114):
it raises when T != E and, when T == E, leaves out expert e wherever token e is padding, so the
counts are silently wrong. On the lines ``MegatronLine.expert_bias_padding_unbroadcast`` names,
:func:`megatron_update_off` switches Megatron's update off for a routing call that has a padding
mask (:func:`counts_in_megatrons_place` says when), and :func:`after_routing` counts in its
place what Megatron's main branch counts (rows outside the padding mask, under Megatron's
condition). This is right on fixed code too.

Shapes: T tokens, E experts.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from rr_core import ReplayError, controller_of
from rr_megatron_compat._versions import megatron_line

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


def counts_in_megatrons_place(router: nn.Module, padding_mask: torch.Tensor | None) -> bool:
    """Whether Megatron's expert-bias update would combine the routing map with
    ``padding_mask`` un-broadcast (G1) in this ``routing`` call: then run the call under
    :func:`megatron_update_off` and pass ``count=True`` to :func:`after_routing`, which counts
    in Megatron's place."""
    return (
        padding_mask is not None
        and megatron_line().expert_bias_padding_unbroadcast
        and bool(getattr(router, "enable_expert_bias", False))
    )


@contextlib.contextmanager
def megatron_update_off(router: nn.Module) -> Iterator[None]:
    """Megatron's expert-bias update switched off around one ``routing`` call (G1)."""
    megatron_router: Any = router  # enable_expert_bias is a plain bool attribute
    enabled = megatron_router.enable_expert_bias
    megatron_router.enable_expert_bias = False
    try:
        yield
    finally:
        megatron_router.enable_expert_bias = enabled


def _count_in_megatrons_place(
    router: nn.Module, routing_map_TE: torch.Tensor, padding_mask: torch.Tensor | None
) -> None:
    """Megatron's expert-bias update as its main branch has it (G1)."""
    if not torch.is_grad_enabled():  # Megatron's own condition: no counts in eval
        return
    with torch.no_grad():
        counted_TE = routing_map_TE
        if padding_mask is not None:
            padding_T1 = padding_mask.reshape(-1, 1).to(device=routing_map_TE.device)
            if padding_T1.shape[0] != routing_map_TE.shape[0]:
                raise ReplayError(
                    f"layer {getattr(router, 'layer_number', '?')}: padding_mask has "
                    f"{padding_T1.shape[0]} rows, the routing map {tuple(routing_map_TE.shape)}; "
                    "pass one mask entry per token ([batch, seq] as input_ids)"
                )
            counted_TE = routing_map_TE & ~padding_T1.bool()
        counts_E: Any = router.local_tokens_per_expert
        counts_E.add_(counted_TE.sum(dim=0))


def after_routing(
    router: nn.Module,
    routing_map_TE: torch.Tensor,
    padding_mask: torch.Tensor | None = None,
    *,
    count: bool = False,
) -> None:
    """``count`` (G1, from :func:`counts_in_megatrons_place`): add this call's expert-bias
    counts in Megatron's place. Then take the rows outside the replay mask back out of
    ``local_tokens_per_expert``."""
    if count:
        _count_in_megatrons_place(router, routing_map_TE, padding_mask)
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
