"""Router doubles: a top-k router that calls the replay hook, and a hash gate that does not.

Shapes: N tokens (flattened), H hidden, E experts, K top-k, G expert groups, V vocabulary.

:class:`FakeTopKRouter` mirrors the parts of Megatron's ``TopKRouter`` that replay depends on:
a ``weight`` of shape [E, H], a global 1-based ``layer_number``, ``is_mtp_layer`` (0.17+),
softmax or sigmoid scores, group-limited top-k (DeepSeek-V3's node-limited routing), and an
expert bias that steers selection but not the weights. Its top-k step goes through
:func:`rr_core.router_topk`, the same hook point the compat layer gives Megatron's router.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from rr_core import router_topk

ScoreFunction = Literal["softmax", "sigmoid"]

#: Where routers announce themselves at construction, like Megatron's process-global list of
#: ``RouterReplay`` objects (0.16+): orphans of a discarded build stay in it (A1).
RouterRegistry = list[nn.Module]


def group_limited_mask_NE(
    scores_NE: torch.Tensor, *, top_k: int, num_groups: int, group_topk: int
) -> torch.Tensor:
    """Megatron's ``group_limited_topk`` selection mask: score each of the G groups by the sum
    of its best ``top_k // group_topk`` experts, keep the ``group_topk`` best groups."""
    n, e = scores_NE.shape
    per_group = scores_NE.detach().view(n, num_groups, e // num_groups)
    group_scores_NG = per_group.topk(top_k // group_topk, dim=-1).values.sum(dim=-1)
    group_ids_NG = group_scores_NG.topk(group_topk, dim=-1, sorted=False).indices
    group_mask_NG = torch.zeros_like(group_scores_NG, dtype=torch.bool)
    group_mask_NG.scatter_(1, group_ids_NG, True)
    return group_mask_NG.repeat_interleave(e // num_groups, dim=1)


class FakeTopKRouter(nn.Module):
    """A tiny MoE router whose top-k step is :func:`rr_core.router_topk`.

    ``forward(x_NH)`` returns ``(probs_NK, ids_NK)``. Softmax scores are taken over all experts
    (``pre_softmax=True``, Megatron's ``moe_router_pre_softmax``) or over the top-k logits;
    sigmoid scores are renormalised over the K chosen (Megatron does so when K > 1). With an
    expert bias or group limit the selection uses biased / masked scores while the weights come
    from the plain scores, which is why the hook receives ``values_TE``. ``last_ids_NK``,
    ``last_scores_NE`` and ``calls`` let tests see what the last forward did.
    """

    expert_bias: torch.Tensor | None

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        *,
        layer_number: int,
        is_mtp_layer: bool = False,
        score_function: ScoreFunction = "softmax",
        pre_softmax: bool = True,
        num_groups: int | None = None,
        group_topk: int | None = None,
        expert_bias: bool = False,
        generator: torch.Generator | None = None,
        registry: RouterRegistry | None = None,
    ) -> None:
        super().__init__()
        _check_router_args(num_experts, top_k, layer_number, score_function, num_groups, group_topk)
        self.weight = nn.Parameter(
            torch.randn(num_experts, hidden_size, generator=generator) * hidden_size**-0.5
        )
        self.register_buffer(
            "expert_bias", torch.zeros(num_experts) if expert_bias else None, persistent=True
        )
        self.num_experts, self.top_k = num_experts, top_k
        self.layer_number, self.is_mtp_layer = layer_number, is_mtp_layer
        self.score_function, self.pre_softmax = score_function, pre_softmax
        self.num_groups, self.group_topk = num_groups, group_topk
        self.last_ids_NK: torch.Tensor | None = None
        self.last_scores_NE: torch.Tensor | None = None
        self.calls = 0
        if registry is not None:
            registry.append(self)

    def forward(self, x_NH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits_NE = x_NH @ self.weight.t()
        if self.score_function == "sigmoid":
            scores_NE = torch.sigmoid(logits_NE)
        elif self.pre_softmax:
            scores_NE = torch.softmax(logits_NE, dim=-1)
        else:  # top-k on the logits, softmax over the K kept
            scores_NE = logits_NE
        select_NE = scores_NE if self.expert_bias is None else scores_NE + self.expert_bias
        if self.num_groups is not None and self.group_topk is not None:
            mask_NE = group_limited_mask_NE(
                select_NE, top_k=self.top_k, num_groups=self.num_groups, group_topk=self.group_topk
            )
            select_NE = select_NE.masked_fill(~mask_NE, float("-inf"))
        values_NE = None if select_NE is scores_NE else scores_NE
        out = router_topk(self, select_NE, self.top_k, values_TE=values_NE)
        probs_NK = out.values_TK
        if self.score_function == "sigmoid" and self.top_k > 1:
            probs_NK = probs_NK / (probs_NK.sum(dim=-1, keepdim=True) + 1e-20)
        elif self.score_function == "softmax" and not self.pre_softmax:
            probs_NK = torch.softmax(probs_NK, dim=-1)
        self.last_ids_NK, self.last_scores_NE = out.ids_TK, scores_NE
        self.calls += 1
        return probs_NK, out.ids_TK

    def extra_repr(self) -> str:
        return (
            f"layer_number={self.layer_number}, experts={self.num_experts}, top_k={self.top_k}, "
            f"score={self.score_function}, is_mtp_layer={self.is_mtp_layer}"
        )


def _check_router_args(
    num_experts: int,
    top_k: int,
    layer_number: int,
    score_function: str,
    num_groups: int | None,
    group_topk: int | None,
) -> None:
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"need 1 <= top_k <= num_experts; got {top_k=}, {num_experts=}")
    if layer_number < 1:
        raise ValueError(f"layer_number is global and 1-based; got {layer_number}")
    if score_function not in ("softmax", "sigmoid"):
        raise ValueError(f"score_function must be 'softmax' or 'sigmoid'; got {score_function!r}")
    if (num_groups is None) != (group_topk is None):
        raise ValueError("set both num_groups and group_topk for group-limited routing, or neither")
    if (
        num_groups is not None
        and group_topk is not None
        and (num_experts % num_groups or top_k % group_topk or not 1 <= group_topk <= num_groups)
    ):
        raise ValueError(
            "group-limited routing needs num_experts % num_groups == 0, "
            f"top_k % group_topk == 0 and 1 <= group_topk <= num_groups; got {num_experts=}, "
            f"{num_groups=}, {top_k=}, {group_topk=}"
        )


def token_hash_NK(token_ids_N: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """K distinct expert ids per token, a fixed function of the token id alone."""
    base_N1 = (token_ids_N.to(torch.int64) * 2654435761 % 2**32).unsqueeze(-1) % num_experts
    return (base_N1 + torch.arange(top_k, device=token_ids_N.device)) % num_experts


class FakeHashGate(nn.Module):
    """The gate of a hash-routed layer (DeepSeek-V4's first layers): experts are a fixed lookup
    of the token id, so there is no top-k step and no replay hook. Its class name does not end in
    ``Router``, so the model walk does not count it; a hook that counts fired routers to find
    its position would be shifted by these layers (A5). Weights are the softmax of the gate
    logits at the hashed ids, so the layer still trains."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        *,
        generator: torch.Generator | None = None,
        hash_fn: Callable[[torch.Tensor, int, int], torch.Tensor] = token_hash_NK,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"need 1 <= top_k <= num_experts; got {top_k=}, {num_experts=}")
        self.weight = nn.Parameter(
            torch.randn(num_experts, hidden_size, generator=generator) * hidden_size**-0.5
        )
        self.num_experts, self.top_k, self.hash_fn = num_experts, top_k, hash_fn

    def forward(
        self, x_NH: torch.Tensor, token_ids_N: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids_NK = self.hash_fn(token_ids_N, self.num_experts, self.top_k)
        probs_NK = torch.softmax(x_NH @ self.weight.t(), dim=-1).gather(-1, ids_NK)
        return probs_NK, ids_NK
