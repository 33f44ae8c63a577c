"""What MindSpeed's routing replacements compute (no hook of Megatron's is reached from them).

- ``routing_tp_extend_ep`` (``mindspeed/core/transformer/moe/moe_feature/common.py``, every
  branch): ``TopKRouter.routing`` without the tensor-parallel gather; its top-k is MindSpeed's
  own import of the top-k function, so a hook on Megatron's module attribute is never reached.
- ``topk_softmax_with_capacity`` (``mindspeed/core/transformer/moe/moe_utils.py``, registered by
  fix-router): Megatron's selection computed in MindSpeed's module (softmax / pre-softmax /
  sigmoid with expert bias, group-limited through its own import of ``group_limited_topk``,
  scaling factor); **then**, when the global ``fix_router`` is set, the indices are overridden
  with ``arange(T * K).view(T, K) % E``; then dense outputs and capacity as Megatron's.

Shapes: T tokens, E experts, K top-k.
"""

from __future__ import annotations

import math
from argparse import Namespace
from collections.abc import Callable
from typing import Any

import torch


def native_dense_routing(
    logits_TE: torch.Tensor, k: int, score_function: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-style dense outputs of a plain top-k: ``(probs_TE, routing_map_TE)``."""
    probs_TE, map_TE, _ = _dense(logits_TE, *_select(logits_TE, k, score_function, None, None))
    return probs_TE, map_TE


def _select(
    logits_TE: torch.Tensor,
    k: int,
    score_function: str,
    expert_bias: torch.Tensor | None,
    group: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None,
    use_pre_softmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    topk = group or (lambda s: torch.topk(s, k=k, dim=1))
    if score_function == "softmax":
        if use_pre_softmax:
            scores = torch.softmax(logits_TE, dim=-1, dtype=torch.float32).type_as(logits_TE)
            return topk(scores)
        scores, ids_TK = topk(logits_TE)
        return torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits_TE), ids_TK
    if score_function == "sigmoid":
        scores = torch.sigmoid(logits_TE.float()).type_as(logits_TE)
        if expert_bias is not None:
            _, ids_TK = topk(scores + expert_bias)
            scores = torch.gather(scores, 1, ids_TK).type_as(logits_TE)
        else:
            scores, ids_TK = topk(scores)
        return (scores / (scores.sum(-1, keepdim=True) + 1e-20) if k > 1 else scores), ids_TK
    raise ValueError(f"Invalid score_function: {score_function}")


def _dense(
    logits_TE: torch.Tensor, probs_TK: torch.Tensor, ids_TK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    probs_TE = torch.zeros_like(logits_TE).scatter(1, ids_TK, probs_TK)
    map_TE = torch.zeros_like(logits_TE).int().scatter(1, ids_TK, 1).bool()
    return probs_TE, map_TE, map_TE.sum(dim=0)


def make_topk_softmax_with_capacity(
    get_full_args: Callable[[], Namespace], group_limited_topk: Any, calls: list[str]
) -> Callable[..., Any]:
    """fix-router's replacement; ``group_limited_topk`` is MindSpeed's own import of it."""

    def topk_softmax_with_capacity(
        logits: torch.Tensor,
        topk: int,
        capacity_factor: float | None = None,
        pad_to_capacity: bool = False,
        drop_policy: str = "probs",
        use_pre_softmax: bool = False,
        num_groups: int | None = None,
        group_topk: int | None = None,
        scaling_factor: float | None = None,
        deterministic_mode: bool = False,
        score_function: str = "softmax",
        expert_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        calls.append("topk_softmax_with_capacity")
        num_tokens, num_experts = logits.shape
        group = None
        if group_topk:
            group = lambda s: group_limited_topk(  # noqa: E731
                scores=s,
                topk=topk,
                num_tokens=num_tokens,
                num_experts=num_experts,
                num_groups=num_groups,
                group_topk=group_topk,
            )
        probs_TK, ids_TK = _select(
            logits, topk, score_function, expert_bias, group, use_pre_softmax
        )
        if scaling_factor:
            probs_TK = probs_TK * scaling_factor
        if getattr(get_full_args(), "fix_router", False):
            ids_TK = torch.arange(ids_TK.numel(), device=ids_TK.device).view(ids_TK.shape)
            ids_TK = ids_TK % num_experts
        probs_TE, map_TE, tokens_per_expert = _dense(logits, probs_TK, ids_TK)
        if capacity_factor is None:
            return probs_TE, map_TE, tokens_per_expert
        capacity = math.ceil(num_tokens * topk / num_experts * capacity_factor)
        ranked = probs_TE if drop_policy == "probs" else map_TE.int()
        keep = torch.topk(ranked, k=min(capacity, num_tokens), dim=0, sorted=True)[1]
        capacity_TE = torch.zeros_like(logits).scatter(0, keep, 1).bool()
        final_TE = capacity_TE if pad_to_capacity else map_TE & capacity_TE
        return probs_TE * final_TE, final_TE, tokens_per_expert

    return topk_softmax_with_capacity


def make_routing_tp_extend_ep(calls: list[str]) -> Callable[..., Any]:
    """moe_tp_extend_ep's replacement of ``TopKRouter.routing`` (a plain top-k of the
    router's own k and score function)."""

    def routing_tp_extend_ep(self: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append("TopKRouter.routing")
        config = getattr(self, "config", None)
        k = getattr(self, "topk", None) or getattr(config, "moe_router_topk", None)
        score = getattr(self, "score_function", None) or getattr(
            config, "moe_router_score_function", "softmax"
        )
        if not isinstance(k, int):
            raise AttributeError("router has neither .topk nor .config.moe_router_topk")
        return native_dense_routing(logits.reshape(-1, logits.shape[-1]), k, str(score))

    return routing_tp_extend_ep


def make_tp_extend_ep_moe_layer(base: type) -> type:
    """moe_tp_extend_ep's replacement of ``MoELayer``: a subclass (MindSpeed's changes the
    dispatcher and experts; its router is still ``TopKRouter``)."""
    return type("MindSpeedAlltoAllSEQTptoEpMoELayer", (base,), {"__module__": __name__})
