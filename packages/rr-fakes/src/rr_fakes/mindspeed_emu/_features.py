"""MindSpeed features that replace Megatron's routing, so a replay hook on the originals is
bypassed.

What they mirror (``npu-facts.md``): ``--moe-tp-extend-ep`` with the ``alltoall_seq``
dispatcher replaces ``TopKRouter.routing``; ``--fix-router`` replaces
``topk_softmax_with_capacity``. Both replacements here route natively with their own
``torch.topk`` and record each call, so a test can show that replay was skipped.

Shapes: T tokens, E experts, K top-k.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def native_dense_routing(
    logits_TE: torch.Tensor, k: int, score_function: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-style dense outputs of a plain top-k: ``(probs_TE, routing_map_TE)``."""
    if score_function == "softmax":
        scores_TE = torch.softmax(logits_TE.float(), dim=-1)
    elif score_function == "sigmoid":
        scores_TE = torch.sigmoid(logits_TE.float())
        scores_TE = scores_TE / scores_TE.sum(dim=-1, keepdim=True)
    else:
        raise ValueError(f"score_function must be 'softmax' or 'sigmoid', got {score_function!r}")
    values_TK, ids_TK = torch.topk(scores_TE, k, dim=-1)
    probs_TE = torch.zeros_like(scores_TE).scatter(-1, ids_TK, values_TK)
    routing_map_TE = torch.zeros_like(scores_TE, dtype=torch.bool).scatter(-1, ids_TK, True)
    return probs_TE.to(logits_TE.dtype), routing_map_TE


def make_tp_extend_ep_routing(calls: list[str]) -> Callable[..., Any]:
    """The replacement of ``TopKRouter.routing`` (``self.topk``, ``self.score_function`` or
    the router's config give k and the score function)."""

    def routing_tp_extend_ep(self: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append("TopKRouter.routing")
        config = getattr(self, "config", None)
        k = getattr(self, "topk", None) or getattr(config, "moe_router_topk", None)
        score = str(
            getattr(self, "score_function", None)
            or getattr(config, "moe_router_score_function", "softmax")
        )
        if not isinstance(k, int):
            raise AttributeError("router has neither .topk nor .config.moe_router_topk")
        return native_dense_routing(logits.reshape(-1, logits.shape[-1]), k, score)

    return routing_tp_extend_ep


def make_fixed_topk_softmax_with_capacity(calls: list[str]) -> Callable[..., Any]:
    """The replacement of ``moe_utils.topk_softmax_with_capacity``; returns
    ``(probs_TE, routing_map_TE, tokens_per_expert_E)`` like Megatron's function."""

    def topk_softmax_with_capacity_fixed(
        logits: torch.Tensor, topk: int, *args: Any, score_function: str = "softmax", **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        calls.append("topk_softmax_with_capacity")
        probs_TE, routing_map_TE = native_dense_routing(logits, topk, score_function)
        return probs_TE, routing_map_TE, routing_map_TE.sum(dim=0)

    return topk_softmax_with_capacity_fixed
