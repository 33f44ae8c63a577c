"""The verl-named API on real megatron-core: verl's call signatures, R2 record -> replay and R3
driven only through those names, a model built twice (A1), and the PP/VPP layout functions
against rr's."""

from __future__ import annotations

import gc
import importlib
import inspect
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import rr_core
import rr_megatron_compat as rmc
import rr_megatron_compat.verl as rv
from compat_megatron_steps import (
    K,
    build,
    capture_maps,
    map_of,
    patched,
    perturb,
    random_targets,
    record_through_verl,
    routers,
)
from rr_core import ReplayError, controller_of


def _params(required: str = "", defaulted_to_none: str = "") -> list[tuple[str, Any]]:
    """A signature's parameters in order: the ``required`` names, then those defaulting to None."""
    return [(name, inspect.Parameter.empty) for name in required.split()] + [
        (name, None) for name in defaulted_to_none.split()
    ]


#: verl 0.9.1 (verl/utils/megatron/router_replay_{patch,utils}.py): parameter names and defaults.
VERL_SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "apply_router_replay_patch": _params(),
    "set_router_replay_data": _params(
        "layers_topk_idx attention_mask tf_config", "vp_rank replay_mask local_cp_size model"
    ),
    "merge_router_topk_indices": _params(
        "attention_mask input_ids mini_layer_topk_idx_list tf_config", "vp_rank local_cp_size model"
    ),
    "iter_model_routers": _params("model"),
    "set_model_router_replay_action": _params("model router_replay_action"),
    "align_r3_router_replay_data": _params("layers_topk_idx input_ids"),
    "build_r3_replay_mask": _params("input_ids response_mask"),
    "reorder_and_merge_vpp_layers": _params(
        "micro_batch_tensor_list num_microbatches vpp_size microbatch_group_size_per_vp_stage"
    ),
    "pp_gather": _params("local_layers_router_map tf_config"),
    "get_current_rank_layer_info": _params("tf_config", "vp_rank"),
    "is_moe_layer": _params("tf_config layer_idx"),
    "get_moe_num_layers_to_build": _params("config", "vp_stage pp_rank"),
    "get_num_layers_to_build": _params("config", "vp_stage pp_rank"),
    "RouterReplay.set_replay_data": _params("all_layers_topk_indices"),
    "RouterReplay.get_recorded_data": _params(),
    "RouterReplay.clear_global_indices": _params(),
    "RouterReplay.set_global_router_replay_action": _params("router_replay_action"),
    "RouterReplay.clear_global_router_replay_action": _params(),
    "RouterReplay.__init__": _params("self"),
    "RouterReplay.set_target_indices": _params("self topk_indices", "replay_mask"),
    "RouterReplay.get_recorded_indices": _params("self"),
    "RouterReplay.clear_indices": _params("self"),
    "RouterReplay.set_router_replay_action": _params("self router_replay_action"),
    "RouterReplay.clear_router_replay_action": _params("self"),
    "RouterReplayHelper.get_micro_batch_router_list": _params("tf_config", "vp_rank"),
    **{
        f"RouterReplayHelper.{name}": _params("tf_config", "vp_rank model")
        for name in ("is_r2_record_action", "is_replay_forward_action", "is_replay_backward_action")
    },
}
VERL_ACTIONS = {
    "RECORD": "record",
    "REPLAY_FORWARD": "replay_forward",
    "REPLAY_BACKWARD": "replay_backward",
}


def test_signatures_and_actions_match_verl() -> None:
    for dotted, expected in VERL_SIGNATURES.items():
        obj: Any = rv
        for part in dotted.split("."):
            obj = getattr(obj, part)
        params = inspect.signature(obj).parameters.values()
        assert [(p.name, p.default) for p in params] == expected, dotted
    assert {a.name: a.value for a in rv.RouterReplayAction} == VERL_ACTIONS


@pytest.fixture
def megatron() -> Iterator[None]:
    with patched(rv.apply_router_replay_patch, rv.remove_router_replay_patch):
        yield


def packed(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Sequences packed into one row ``[1, T]``: router rows are verl's packed order."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ids = torch.randint(0, 64, (1, total), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": positions, "labels": ids.roll(-1, 1)}


def forward(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(
        batch["input_ids"], batch["position_ids"], attention_mask=None, labels=batch["labels"]
    )
    return out.float().mean()


def test_r2_record_then_replay_through_the_verl_names(megatron: None) -> None:
    model = build(recompute=True)
    tc = model.config
    batches = [packed([5, 7], seed=0), packed([6, 6], seed=1)]
    mask = torch.ones(1, 12, dtype=torch.bool)
    with capture_maps(model) as native:
        routes = record_through_verl(model, batches, mask, forward)  # pp=1: gather unchanged
    assert routes.dtype == torch.int16
    assert routes.shape == (2, 12, 4, K)
    for layer in range(1, 5):
        for mb in range(2):
            assert torch.equal(native[layer][mb], map_of(routes[mb, :, layer - 1].long()))

    perturb(model)
    rv.RouterReplay.set_global_router_replay_action(rv.RouterReplayAction.REPLAY_FORWARD)
    losses = []
    with capture_maps(model) as replayed:
        for mb, batch in enumerate(batches):
            if rv.RouterReplayHelper.is_replay_backward_action(tc, model=model):
                rv.set_model_router_replay_action(model, rv.RouterReplayAction.REPLAY_FORWARD)
            assert rv.RouterReplayHelper.is_replay_forward_action(tc, model=model)
            rv.set_router_replay_data(routes[mb : mb + 1], mask, tc, model=model)
            losses.append(forward(model, batch))
            rv.set_model_router_replay_action(model, rv.RouterReplayAction.REPLAY_BACKWARD)
        for loss in reversed(losses):  # backward recompute out of forward order
            loss.backward()
    rv.RouterReplay.clear_global_indices()
    rv.RouterReplay.clear_global_router_replay_action()
    for layer in range(1, 5):
        for mb in range(2):
            assert torch.equal(replayed[layer][mb], native[layer][mb])
    with pytest.raises(ReplayError, match="position"):
        rv.RouterReplay.set_replay_data([])


def test_names_verl_users_reach_for_behave_like_verl_or_name_the_rr_way(megatron: None) -> None:
    model = build()
    tc = model.config
    router_module = importlib.import_module("megatron.core.transformer.moe.router")
    assert rv.TopKRouter is router_module.TopKRouter
    # verl's patch gives every router built after it a router_replay; so does rr, on every line
    assert all(getattr(r, "router_replay", None) is not None for _, r in routers(model))
    assert len(rv.RouterReplay.router_instances) == 4  # built, not yet used: verl's count
    views = dict(rv.iter_model_routers(model))
    if not rmc.megatron_line().native_replay:  # Megatron 0.16+ keeps its own object there
        assert all(r.router_replay is views[n] for n, r in routers(model))
    batch = packed([5, 7])
    mask = torch.ones(1, 12, dtype=torch.bool)
    targets = random_targets(12, 4, seed=3).to(torch.int16)
    rv.RouterReplay.set_global_router_replay_action(rv.RouterReplayAction.REPLAY_FORWARD)
    assert views[2].target_topk_idx is None
    rv.set_router_replay_data(targets.unsqueeze(0), mask, tc, model=model)
    assert torch.equal(views[2].target_topk_idx, targets[:, 1])  # staged for the next forward
    with torch.no_grad():
        forward(model, batch)
    assert torch.equal(views[3].target_topk_idx, targets[:, 2])  # what the forward replayed
    with pytest.raises(ReplayError, match="rr records in the router's own top-k step"):
        views[1].record_indices(targets[:, 0])
    with pytest.raises(ReplayError, match="set_router_replay_data"):
        views[1].get_replay_topk(torch.rand(12, 8), K)
    rv.RouterReplay.clear_global_indices()
    rv.RouterReplay.set_global_router_replay_action(rv.RouterReplayAction.RECORD)
    with torch.no_grad():
        forward(model, batch)
    recorded = [views[n].recorded_topk_idx for n in range(1, 5)]
    assert all(r is not None and r.shape == (12, K) for r in recorded)
    data = rv.RouterReplay.get_recorded_data()
    assert len(data) == 4
    assert all(torch.equal(a, b) for a, b in zip(data, recorded, strict=True))
    rv.RouterReplay.clear_global_indices()
    rv.RouterReplay.clear_global_router_replay_action()


def test_r3_round_trip_replays_engine_routes_on_masked_rows(megatron: None) -> None:
    model = build(recompute=True)
    tc = model.config
    lengths = [5, 7]
    input_ids = torch.nested.nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    engine = [random_targets(n - 1, 4, seed=n) for n in lengths]  # no route for the last token
    nested = torch.nested.nested_tensor(engine, layout=torch.jagged)
    aligned = rv.align_r3_router_replay_data(nested, input_ids)
    response = torch.tensor([[1, 1, 0], [0, 0, 0]])  # the second sequence has no response
    mask = rv.build_r3_replay_mask(input_ids, response)
    assert mask.values().tolist() == [True] * 4 + [False] + [False] * 7
    rv.set_model_router_replay_action(model, rv.RouterReplayAction.REPLAY_FORWARD)
    rv.set_router_replay_data(aligned, None, tc, replay_mask=mask, model=model)
    with capture_maps(model) as maps:
        forward(model, packed(lengths)).backward()
    rv.RouterReplay.clear_global_indices()
    for layer in range(1, 5):
        got = maps[layer][0]
        assert torch.equal(got[:4], map_of(engine[0][:4, layer - 1]))
    with pytest.raises(ReplayError, match="nothing is armed"):  # REPLAY without data raises
        forward(model, packed(lengths))
    rv.RouterReplay.clear_global_indices()


def test_A1_action_on_a_model_built_twice_touches_only_live_routers(megatron: None) -> None:
    orphan = build()
    live = build()
    rv.set_model_router_replay_action(live, rv.RouterReplayAction.RECORD)
    assert [n for n, _ in rv.iter_model_routers(live)] == [1, 2, 3, 4]
    # verl's router_instances: every live router built with replay enabled, orphans included
    assert len(rv.RouterReplay.router_instances) == 8
    assert all(controller_of(r) is not None for _, r in routers(live))
    for _, router in routers(orphan):
        assert controller_of(router) is None
        native = getattr(router, "router_replay", None)
        if native is not None:
            assert native.router_replay_action is None
    assert [
        v.layer_number for v in rv.RouterReplayHelper.get_micro_batch_router_list(live.config)
    ] == [1, 2, 3, 4]
    rv.set_model_router_replay_action(orphan, rv.RouterReplayAction.RECORD)  # now two models
    with pytest.raises(ReplayError, match="more than one attached model"):
        rv.RouterReplayHelper.get_micro_batch_router_list(live.config)


def test_a_dropped_model_leaves_router_instances_and_detaches_itself(megatron: None) -> None:
    """rr holds no model strongly (verl never calls a release function)."""
    dropped, live = build(), build()
    for model in (dropped, live):
        rv.set_model_router_replay_action(model, rv.RouterReplayAction.RECORD)
    assert len(rv.RouterReplay.router_instances) == 8
    kept = [r for _, r in routers(dropped)][:1]  # a router someone still holds
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None
    assert len(rv.RouterReplay.router_instances) == 5  # the live model's, and the one held
    assert all(controller_of(r) is not None for _, r in routers(live))
    assert controller_of(kept[0]) is None  # its model went: rr released it


@pytest.mark.parametrize(
    ("pp", "vp", "freq"), [(1, None, 1), (2, None, [0, 1, 1, 1, 0, 1, 1, 1]), (2, 2, 2)]
)
def test_pp_vpp_layout_functions_agree_with_rr_layout(
    megatron: None, pp: int, vp: int | None, freq: Any
) -> None:
    tc = SimpleNamespace(
        num_layers=8,
        moe_layer_freq=freq,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
    )
    cfg = rr_core.LayoutConfig(num_layers=8, moe_layer_freq=freq, pp_size=pp, vp_size=vp)
    for layer in range(8):
        assert rv.is_moe_layer(tc, layer) == rr_core.is_moe_layer(cfg, layer + 1)
    for rank in range(pp):
        for stage in [None] if vp is None else range(vp):
            n = rv.get_num_layers_to_build(tc, vp_stage=stage, pp_rank=rank)
            assert n == rr_core.num_layers_to_build(cfg, rank, stage)
            moe = rv.get_moe_num_layers_to_build(tc, vp_stage=stage, pp_rank=rank)
            assert moe == len(rr_core.stage_moe_layer_numbers(cfg, rank, stage))
    info = rv.get_current_rank_layer_info(tc, 0 if vp else None)
    assert info == {
        "start": 0,
        "end": rr_core.num_layers_to_build(cfg, 0, 0 if vp else None),
        "count": rr_core.num_layers_to_build(cfg, 0, 0 if vp else None),
    }
    if vp:  # 2 micro-batches x 2 chunks in schedule order; chunk c holds layer slot value c
        records = {
            (mb, c): torch.full((1, 3, 1 + c, K), 10 * mb + c, dtype=torch.int16)
            for mb in range(2)
            for c in range(2)
        }
        from megatron.core.pipeline_parallel.schedules import get_schedule_table

        table = get_schedule_table(2, 2, 2)
        merged = rv.reorder_and_merge_vpp_layers([records[tuple(t)] for t in table], 2, 2, 2)
        assert merged.shape == (2, 3, 3, K)
        assert merged[:, 0, :, 0].tolist() == [[0, 1, 1], [10, 11, 11]]
        with pytest.raises(rr_core.LayoutError):
            rv.reorder_and_merge_vpp_layers([records[(0, 0)]], 2, 2, 2)
