"""The model walk: routers keyed by global layer number, scoped to the decoder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rr_core import ReplayController, ReplayMode, WalkError, find_orphans, walk_routers

from rr_core_testing import RecordingRouter, TinyLayer, TinyModel


def layers_of(model: nn.Module | list[nn.Module]) -> list[int]:
    return [layer for layer, _ in walk_routers(model)]


def test_plain_decoder_yields_every_router_once_in_layer_order() -> None:
    model = TinyModel(num_layers=4)
    walked = walk_routers(model)
    assert [layer for layer, _ in walked] == [1, 2, 3, 4]
    assert [router for _, router in walked] == [layer.router for layer in model.moe_layers()]


def test_A2_dense_first_layers_have_no_router_and_keep_their_numbers() -> None:
    model = TinyModel(num_layers=5, moe=[False, False, True, True, True])
    assert layers_of(model) == [3, 4, 5]


def test_A4_mtp_routers_restarting_at_one_are_never_yielded() -> None:
    model = TinyModel(num_layers=3, mtp_layers=2)
    assert layers_of(model) == [1, 2, 3]
    # Walking the whole module without the decoder scope would see MTP layer 1 twice.
    flagged = RecordingRouter(8, 6, 2, layer_number=1)
    flagged.is_mtp_layer = True
    holder = nn.Sequential(TinyLayer(1, 8, 6, 2, moe=True), flagged)
    assert layers_of(holder) == [1]


def test_A4_two_routers_claiming_one_layer_raise() -> None:
    holder = nn.ModuleList([TinyLayer(1, 8, 6, 2, moe=True), TinyLayer(1, 8, 6, 2, moe=True)])
    with pytest.raises(WalkError, match="two routers claim layer 1"):
        walk_routers(holder)


@settings(max_examples=50, deadline=None)
@given(order=st.permutations(range(6)), dense=st.sets(st.integers(0, 5), max_size=5))
def test_A6_hybrid_models_are_walked_in_layer_order_not_module_order(
    order: list[int], dense: set[int]
) -> None:
    """Extra submodules between layers and layers registered out of order (hybrid models)."""
    modules: list[nn.Module] = []
    for i in order:
        modules.append(nn.Linear(2, 2))  # e.g. an attention or Mamba block between layers
        modules.append(TinyLayer(i + 1, 8, 6, 2, moe=i not in dense))
    model = nn.Sequential(*modules)
    expected = sorted(i + 1 for i in range(6) if i not in dense)
    assert layers_of(model) == expected


def test_A6_stage_without_moe_layers_still_takes_part() -> None:
    """A pipeline stage holding only dense layers walks to nothing, attaches and accepts routes
    for the whole model (so it can join collective gathers)."""
    stage = TinyModel(num_layers=2, moe=[False, False], first_layer_number=3)
    ctrl = ReplayController(num_experts=6, top_k=2)
    try:
        assert ctrl.attach(stage) == ()
        ctrl.set_mode(ReplayMode.REPLAY)
        ctrl.arm(0, torch.zeros(4, 2, 2, dtype=torch.uint8), layer_numbers=[1, 2])
        stage(torch.randn(4, 8))
        ctrl.end_step()
    finally:
        ctrl.detach()


def test_A3_vpp_chunks_are_merged_by_global_layer_number() -> None:
    """PP=2, VPP=2, 8 layers: this rank holds chunks with layers 1-2 and 5-6."""
    chunks = [
        TinyModel(num_layers=2, first_layer_number=5),
        TinyModel(num_layers=2, first_layer_number=1),
    ]
    assert layers_of(chunks) == [1, 2, 5, 6]


def test_wrappers_are_unwrapped_down_to_the_decoder() -> None:
    class Wrapper(nn.Module):
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    model = TinyModel(num_layers=2, mtp_layers=1)
    assert layers_of(Wrapper(Wrapper(model))) == [1, 2]


def test_A1_orphans_from_a_model_built_twice_are_reported() -> None:
    registry: list[nn.Module] = []  # a process-global list, as Megatron's RouterReplay keeps
    discarded = TinyModel(num_layers=3, seed=1)
    registry += [layer.router for layer in discarded.moe_layers()]
    live = TinyModel(num_layers=3, seed=2)
    registry += [layer.router for layer in live.moe_layers()]
    walked = walk_routers(live)
    orphans = find_orphans(registry, walked)
    assert orphans == registry[:3]
    assert [router for _, router in walked] == registry[3:]


def test_router_without_layer_number_raises() -> None:
    with pytest.raises(WalkError, match="has no layer_number"):
        walk_routers(nn.Sequential(RecordingRouter(8, 6, 2)))


def test_layer_number_must_be_one_based() -> None:
    with pytest.raises(WalkError, match="expected a global 1-based"):
        walk_routers(nn.Sequential(RecordingRouter(8, 6, 2, layer_number=0)))


def test_custom_predicate_and_shared_router_counted_once() -> None:
    router = RecordingRouter(8, 6, 2, layer_number=4)
    model = nn.ModuleDict({"a": router, "b": nn.Sequential(router)})
    walked = walk_routers(model, is_router=lambda m: isinstance(m, RecordingRouter))
    assert walked == [(4, router)]
    assert walk_routers(model, is_router=lambda m: False) == []


@pytest.mark.parametrize("bad", [None, 3, "model", [], [nn.Linear(2, 2), "chunk"], torch.zeros(2)])
def test_walking_something_that_is_not_a_model_raises(bad: object) -> None:
    with pytest.raises(WalkError, match=r"model must be an nn.Module or a non-empty sequence"):
        walk_routers(bad)  # type: ignore[arg-type]
    with pytest.raises(WalkError, match=r"model must be an nn.Module"):
        ReplayController(num_experts=6, top_k=2).attach(bad)  # type: ignore[arg-type]
