"""ReplayController.attach(walk=...): models whose layers carry no layer_number give their own
(layer number, router) pairs; the controller checks them as strictly as its own walk."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode, router_topk


class Router(nn.Module):
    def forward(self, scores_TE: torch.Tensor):
        return router_topk(self, scores_TE, 2)


def test_a_custom_walk_attaches_in_layer_order() -> None:
    first, second = Router(), Router()
    model = nn.ModuleList([first, second])
    controller = ReplayController(num_experts=4, top_k=2)
    layers = controller.attach(model, walk=lambda m: [(5, m[1]), (2, m[0])])
    try:
        assert layers == (2, 5)
        controller.set_mode(ReplayMode.REPLAY)
        routes_TLK = torch.tensor([[[0, 1], [2, 3]]])
        controller.arm(0, routes_TLK, layer_numbers=(2, 5))
        scores = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
        assert first(scores).ids_TK.tolist() == [[0, 1]]
        assert second(scores).ids_TK.tolist() == [[2, 3]]
        controller.end_step()
    finally:
        controller.detach()


@pytest.mark.parametrize(
    "pairs",
    [
        "not pairs",
        [(0, Router())],
        [(1.0, Router())],
        [(True, Router())],
        [(1, "router")],
        [(1, Router(), 3)],
    ],
    ids=["str", "layer-0", "float-layer", "bool-layer", "not-a-module", "triple"],
)
def test_a_walk_returning_something_else_is_refused(pairs: object) -> None:
    controller = ReplayController(num_experts=4, top_k=2)
    with pytest.raises(ReplayError, match="walk must return a sequence of"):
        controller.attach(nn.Module(), walk=lambda _m: pairs)  # type: ignore[arg-type,return-value]
    assert controller.layer_numbers == ()


def test_a_walk_naming_a_layer_or_router_twice_is_refused() -> None:
    router = Router()
    controller = ReplayController(num_experts=4, top_k=2)
    with pytest.raises(ReplayError, match=r"a layer or a router twice: layers \[1, 1\]"):
        controller.attach(nn.Module(), walk=lambda _m: [(1, Router()), (1, Router())])
    with pytest.raises(ReplayError, match="twice"):
        controller.attach(nn.Module(), walk=lambda _m: [(1, router), (2, router)])
