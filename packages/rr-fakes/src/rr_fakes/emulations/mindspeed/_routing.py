"""What MindSpeed's routing replacements compute (no hook of Megatron's is reached from them).

- ``routing_tp_extend_ep(self, logits)`` (``mindspeed/core/transformer/moe/moe_feature/common.py``,
  read on 26.1.0_core_r0.12.1 and core_r0.16.0): exactly two parameters. It views the logits as
  ``[T, E]``, applies the router's z-loss, gathers them from the sequence-parallel region, then
  by ``self.routing_type``: ``sinkhorn`` -> ``self.sinkhorn_load_balancing``, ``aux_loss`` ->
  ``self.aux_loss_load_balancing`` (Megatron's method, which calls the router module's top-k:
  the function rr hooks on 0.12), ``none`` -> MindSpeed's own import of
  ``topk_softmax_with_capacity`` (imported on 0.12 only: a NameError on 0.16), anything else a
  ValueError; then splits scores and map along the first dimension again. On megatron-core
  0.16+ ``TopKRouter.forward`` calls ``self.routing(logits, padding_mask=...)``, so the first
  forward raises TypeError, and Megatron's router has no ``aux_loss_load_balancing`` there.
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


def make_routing_tp_extend_ep(
    own_topk: Callable[..., Any] | None,
    gather: Callable[[torch.Tensor], torch.Tensor],
    split: Callable[[torch.Tensor], torch.Tensor],
    calls: list[str],
) -> Callable[..., Any]:
    """moe_tp_extend_ep's replacement of ``TopKRouter.routing``; ``own_topk`` is MindSpeed's
    import of ``topk_softmax_with_capacity`` (None where its module imports none), ``gather`` /
    ``split`` Megatron's sequence-parallel mappings."""

    def routing_tp_extend_ep(self: Any, logits: torch.Tensor) -> Any:
        calls.append("TopKRouter.routing")
        logits = logits.view(-1, self.config.num_moe_experts)
        logits = self.apply_z_loss(logits)
        logits = gather(logits)
        if self.routing_type == "sinkhorn":
            scores, routing_map = self.sinkhorn_load_balancing(logits)
        elif self.routing_type == "aux_loss":
            scores, routing_map = self.aux_loss_load_balancing(logits)
        elif self.routing_type == "none":
            if own_topk is None:
                raise NameError("name 'topk_softmax_with_capacity' is not defined")
            scores, routing_map, _ = own_topk(
                logits,
                self.topk,
                capacity_factor=self.config.moe_expert_capacity_factor,
                pad_to_capacity=self.config.moe_pad_expert_input_to_capacity,
                drop_policy=self.config.moe_token_drop_policy,
                use_pre_softmax=self.config.moe_router_pre_softmax,
                deterministic_mode=self.config.deterministic_mode,
            )
        else:
            raise ValueError(f"Unsupported MoE routing type: {self.routing_type}")
        return split(scores), split(routing_map)

    return routing_tp_extend_ep


def _sequential_experts() -> Any:
    """Megatron's per-expert MLPs: the CPU stand-in for MindSpeed's grouped-matmul experts."""
    import importlib

    spec = importlib.import_module("megatron.core.transformer.spec_utils").ModuleSpec
    experts = importlib.import_module("megatron.core.transformer.moe.experts")
    mlp = importlib.import_module("megatron.core.transformer.mlp")
    layers = importlib.import_module("megatron.core.tensor_parallel.layers")
    return spec(
        module=experts.SequentialMLP,
        submodules=mlp.MLPSubmodules(
            linear_fc1=layers.ColumnParallelLinear, linear_fc2=layers.RowParallelLinear
        ),
    )


def _megatron(name: str) -> Any:
    import importlib

    return importlib.import_module(f"megatron.core.{name}")


def _seq_dispatcher() -> Any:
    """Megatron's alltoall_seq dispatcher (0.12) standing in for MindSpeed's; Megatron's
    alltoall one where the release has no alltoall_seq (0.16)."""
    try:
        return _megatron(
            "transformer.moe.legacy_a2a_token_dispatcher"
        ).MoEAlltoAllSEQTokenDispatcher
    except ImportError:
        return _megatron("transformer.moe.token_dispatcher").MoEAlltoAllTokenDispatcher


def make_tp_extend_ep_moe_layer(base: type) -> type:
    """moe_tp_extend_ep's replacement of ``MoELayer`` (``MindSpeedAlltoAllSEQTptoEpMoELayer``):
    a subclass whose ``__init__`` is ``All2AllSeqTpExtendEpMoELayerImpl``'s, which never runs
    Megatron's ``MoELayer.__init__`` (that one names the module's ``MoELayer``, the replacement
    once patched): Megatron's base-layer set-up, Megatron's ``TopKRouter``, a ValueError without
    ``moe_grouped_gemm``, then MindSpeed's grouped-matmul experts and alltoall_seq dispatcher,
    for which Megatron's per-expert MLPs and dispatcher stand in on CPU. Over a stand-in
    ``base`` (torch-only tests) it is a plain subclass."""
    if not str(base.__module__).startswith("megatron."):
        return type("MindSpeedAlltoAllSEQTptoEpMoELayer", (base,), {"__module__": __name__})
    base_layer = _megatron("transformer.moe.moe_layer").BaseMoELayer

    class MindSpeedAlltoAllSEQTptoEpMoELayer(base):  # type: ignore[misc]
        def __init__(self, config: Any, submodules: Any = None, layer_number: Any = None) -> None:
            self.submodules = submodules
            base_layer.__init__(self, config=config, layer_number=layer_number)
            self.moe_layer_recompute = bool(getattr(config, "moe_layer_recompute", False))
            self.router = _megatron("transformer.moe.router").TopKRouter(config=self.config)
            if not self.config.moe_grouped_gemm:
                raise ValueError("use tp_extend_ep should open moe_grouped_gemm")
            build = _megatron("transformer.spec_utils").build_module
            self.experts = build(_sequential_experts(), self.num_local_experts, self.config)
            self.token_dispatcher = _seq_dispatcher()(
                self.num_local_experts, self.local_expert_indices, config=self.config
            )
            if getattr(self, "use_shared_expert", False):
                self.shared_experts = build(self.submodules.shared_experts, config=self.config)

    return MindSpeedAlltoAllSEQTptoEpMoELayer
