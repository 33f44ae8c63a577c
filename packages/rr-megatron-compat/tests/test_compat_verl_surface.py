"""The verl drop-in's module surface on real megatron-core: verl's module-level names exist on
``rr_megatron_compat.verl`` and replacing one there changes what rr does (as a test or a hot-fix
that patches verl's module would); ``attention_mask=None`` means every row is a token;
``RouterReplay()`` objects built by a router are the ones rr drives; stand-in routers (no
config, no layer_number) are addressed as verl addresses them."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import rr_megatron_compat.verl as rv
from compat_megatron_steps import K, build, capture_maps, map_of, random_targets
from rr_core import LayoutError, ReplayError
from rr_megatron_compat import ReplayConfigError

#: verl 0.9.1's module-level names (router_replay_patch.py and router_replay_utils.py) beyond
#: rr's public API: what they import and their helpers.
VERL_MODULE_NAMES = {
    "Enum", "MoEAlltoAllTokenDispatcher", "TopKRouter", "TransformerConfig",
    "_context_parallel_layout", "_get_aux_loss_coeff", "_is_aux_loss_enabled",
    "_patched_topk_routing_with_score_function", "apply_router_token_dropping",
    "compute_routing_scores_for_aux_loss", "device_name", "gather_from_sequence_parallel_region",
    "get_device_name", "get_schedule_table", "get_transformer_layer_offset", "group_limited_topk",
    "inspect", "is_vp_first_stage", "is_vp_last_stage", "mpu", "patched_routing",
    "postprocess_packed_seqs", "postprocess_thd_engine", "preprocess_packed_seqs",
    "preprocess_thd_engine", "scatter_to_sequence_parallel_region", "torch", "types",
    "warnings", "wraps",
}  # fmt: skip


def megatron_has(module: str, attribute: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


@pytest.fixture
def clean() -> Iterator[None]:
    yield
    rv.RouterReplay.clear_global_router_replay_action()
    rv.remove_router_replay_patch()


def nested(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def test_every_verl_module_name_is_on_rrs_module(megatron: None) -> None:
    missing = sorted(name for name in VERL_MODULE_NAMES if not hasattr(rv, name))
    # only names whose Megatron source this line lacks (verl's module lacks them there too)
    sources = rv._MEGATRON
    assert [n for n in missing if n not in sources or megatron_has(*sources[n])] == []
    assert set(rv.VERL_MODULE_NAMES) == VERL_MODULE_NAMES
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router import TopKRouter

    assert rv.mpu is parallel_state
    assert rv.TopKRouter is TopKRouter
    assert rv.device_name == ("cuda" if torch.cuda.is_available() else "cpu")


def test_replacing_mpu_moves_the_stage_rr_addresses(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SimpleNamespace(num_layers=8, moe_layer_freq=1, pipeline_model_parallel_size=2)
    assert rv.get_current_rank_layer_info(cfg) == {"start": 0, "end": 4, "count": 4}
    rank1 = SimpleNamespace(get_pipeline_model_parallel_rank=lambda: 1)
    monkeypatch.setattr(rv, "mpu", rank1)
    assert rv.get_current_rank_layer_info(cfg) == {"start": 4, "end": 8, "count": 4}
    assert rv.get_num_layers_to_build(cfg) == 4
    monkeypatch.setattr(rv, "get_transformer_layer_offset", lambda config, vp_stage=None: 2)
    assert rv.get_current_rank_layer_info(cfg)["start"] == 2


def test_replacing_the_sp_scatter_and_the_packing_changes_the_staged_rows(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build()
    tc = model.config
    routes = random_targets(6, 4).unsqueeze(0)  # [1, 6, 4, K]
    calls: list[str] = []

    def pack(x: torch.Tensor, mask: Any, **kw: Any) -> tuple[torch.Tensor, None]:
        calls.append("pack")
        return x, None

    monkeypatch.setattr(rv, "preprocess_packed_seqs", pack)
    monkeypatch.setattr(rv, "scatter_to_sequence_parallel_region", lambda x: (x + 1) % 8)
    rv.set_router_replay_data(routes, None, tc, model=model)
    assert calls == ["pack"]
    for layer, view in rv.iter_model_routers(model):
        assert torch.equal(view.target_topk_idx, (routes[0, :, layer - 1] + 1) % 8)
    rv.RouterReplay.clear_global_indices()


def test_replacing_get_schedule_table_reorders_the_vpp_merge(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = torch.zeros(1, 2, 1, K, dtype=torch.int16), torch.ones(1, 2, 1, K, dtype=torch.int16)
    assert rv.reorder_and_merge_vpp_layers([a, b], 1, 2, 1)[0, 0, :, 0].tolist() == [0, 1]
    monkeypatch.setattr(rv, "get_schedule_table", lambda *args: [(0, 1), (0, 0)])
    assert rv.reorder_and_merge_vpp_layers([a, b], 1, 2, 1)[0, 0, :, 0].tolist() == [1, 0]


def test_replacing_topkrouter_changes_which_modules_are_routers(
    monkeypatch: pytest.MonkeyPatch, clean: None
) -> None:
    class Gate(nn.Module):  # not named "...Router": rr's own rule would skip it
        def __init__(self, layer_number: int) -> None:
            super().__init__()
            self.layer_number = layer_number

    model = nn.ModuleList([Gate(1), Gate(2)])
    assert list(rv.iter_model_routers(model)) == []
    monkeypatch.setattr(rv, "TopKRouter", Gate)
    model = nn.ModuleList([Gate(1), Gate(2)])
    assert [n for n, _ in rv.iter_model_routers(model)] == [1, 2]


class StandInRouter(nn.Module):
    """A test's router: only a layer number and the RouterReplay it builds, as verl's do."""

    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.router_replay = rv.RouterReplay()


def test_a_routers_own_routerreplay_is_the_one_rr_drives_orphans_stay_empty(
    megatron: None, clean: None
) -> None:
    orphans = [rv.RouterReplay() for _ in range(2)]
    model = nn.ModuleList([StandInRouter(n) for n in (1, 2, 3)])
    assert all(o in rv.RouterReplay.router_instances for o in orphans)
    cfg = SimpleNamespace(fp8=None, num_layers=3, moe_layer_freq=1)
    routes = torch.arange(1 * 4 * 3 * 2).reshape(1, 4, 3, 2)
    rv.set_router_replay_data(routes, None, cfg, model=model)  # before any forward: no attach
    for layer, router in enumerate(model):
        assert dict(rv.iter_model_routers(model))[layer + 1] is router.router_replay
        assert torch.equal(router.router_replay.target_topk_idx, routes[0, :, layer])
    assert all(o.target_topk_idx is None for o in orphans)
    rv.set_model_router_replay_action(model, rv.RouterReplayAction.REPLAY_FORWARD)
    assert all(o.router_replay_action is None for o in orphans)
    assert "no router" in repr(orphans[0])
    with pytest.raises(ReplayError, match="belongs to no router"):
        orphans[0].set_target_indices(routes[0, :, 0])
    rv.RouterReplay.set_global_router_replay_action(rv.RouterReplayAction.RECORD)
    assert all(o.router_replay_action is rv.RouterReplayAction.RECORD for o in orphans)


def test_attention_mask_none_takes_every_row_as_a_token(megatron: None) -> None:
    model = build()
    tc = model.config
    routes = random_targets(2 * 5, 4).reshape(2, 5, 4, K)
    rv.set_router_replay_data(routes, None, tc, model=model)
    staged = {n: view.target_topk_idx for n, view in rv.iter_model_routers(model)}
    rv.RouterReplay.clear_global_indices()
    rv.set_router_replay_data(routes, torch.ones(2, 5, dtype=torch.bool), tc, model=model)
    for n, view in rv.iter_model_routers(model):
        assert torch.equal(staged[n], routes.reshape(10, 4, K)[:, n - 1])
        assert torch.equal(view.target_topk_idx, staged[n])
    rv.RouterReplay.clear_global_indices()


def test_merge_without_attention_mask_returns_every_row(megatron: None) -> None:
    model = build()
    tc = model.config
    ids = torch.randint(0, 64, (1, 6))
    rv.set_model_router_replay_action(model, rv.RouterReplayAction.RECORD)
    with capture_maps(model) as native, torch.no_grad():
        model(ids, torch.arange(6).unsqueeze(0), attention_mask=None)
    unmasked: list[torch.Tensor] = []
    rv.merge_router_topk_indices(None, ids, unmasked, tc, model=model)
    masked: list[torch.Tensor] = []
    rv.merge_router_topk_indices(torch.ones(1, 6, dtype=torch.bool), ids, masked, tc, model=model)
    assert unmasked[0].shape == (1, 6, 4, K)
    assert torch.equal(unmasked[0], masked[0])
    for layer in range(1, 5):
        assert torch.equal(native[layer][0], map_of(unmasked[0][0, :, layer - 1].long()))
    rv.RouterReplay.clear_global_indices()
    rv.set_model_router_replay_action(model, None)


def test_stand_in_routers_from_a_replaced_helper_are_placed_by_position(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: dict[str, Any] = {}
    router = SimpleNamespace(
        recorded_topk_idx=torch.tensor([[1], [2]]),
        set_target_indices=lambda ids, replay_mask=None: got.update(ids=ids, mask=replay_mask),
    )
    monkeypatch.setattr(
        rv.RouterReplayHelper, "get_micro_batch_router_list", lambda *args: [router]
    )
    dtypes: list[torch.dtype] = []

    def gather(t: torch.Tensor, **kw: Any) -> torch.Tensor:
        dtypes.append(t.dtype)
        return t

    monkeypatch.setattr(rv, "gather_from_sequence_parallel_region", gather)
    cfg = SimpleNamespace(fp8=None, num_layers=1, moe_layer_freq=1)
    recorded: list[torch.Tensor] = []
    rv.merge_router_topk_indices(None, nested([torch.arange(2)]), recorded, cfg)
    assert dtypes == [torch.uint8]  # the collective carries int16 ids as bytes
    assert recorded[0].dtype == torch.int16
    assert recorded[0].values().tolist() == [[[1]], [[2]]]
    rv.set_router_replay_data(recorded[0], None, cfg)
    assert got["ids"].dtype == torch.int64  # verl's targets for a router that is not rr's
    assert got["ids"].tolist() == [[1], [2]]
    assert got["mask"] is None
    monkeypatch.setattr(rv, "get_current_rank_layer_info", lambda *a: {"start": 0, "end": 0})
    with pytest.raises(ReplayError, match="by position"):
        rv.set_router_replay_data(recorded[0], None, cfg)


def test_pp_gather_takes_a_config_with_only_the_pipeline_fields(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = torch.zeros(1, 2, 1, K, dtype=torch.int16)
    assert rv.pp_gather(local, SimpleNamespace(pipeline_model_parallel_size=1)) is local
    monkeypatch.setattr(rv, "mpu", SimpleNamespace(get_pipeline_model_parallel_group=object))
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    vpp = SimpleNamespace(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    with pytest.raises(LayoutError, match="num_layers"):
        rv.pp_gather(local, vpp)
    with pytest.raises(LayoutError, match="has 2 ranks but pipeline_model_parallel_size=3"):
        rv.pp_gather(local, SimpleNamespace(pipeline_model_parallel_size=3))


def test_packing_round_trips_and_refuses_what_rr_cannot_pack(megatron: None) -> None:
    seqs = [torch.arange(3 * 2).reshape(3, 1, 2), torch.arange(4 * 2).reshape(4, 1, 2)]
    routes = nested(seqs)
    rows, params, extra = rv.preprocess_thd_engine(routes)
    assert extra is None
    assert torch.equal(rows[0], routes.values())  # tp = cp = 1: verl's packed order is the values
    back = rv.postprocess_thd_engine(rows, params, routes, 2)
    assert torch.equal(back.values(), routes.values())
    dense = torch.arange(2 * 3).reshape(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    packed, dense_params = rv.preprocess_packed_seqs(dense, mask)
    assert packed[0].tolist() == [0, 1, 3]
    assert rv.postprocess_packed_seqs(packed, dense_params, mask, 2, 3).tolist() == [
        [0, 1, 0],
        [3, 0, 0],
    ]
    refused: list[dict[str, Any]] = [
        {"use_fp8_padding": True},
        {"cp_layout": "contiguous"},
        {"need_roll": True},
        {"min_local_rows": 4},
        {"pad_to_length_bucket": 64},
    ]
    for kw in refused:
        with pytest.raises(ReplayConfigError):
            rv.preprocess_thd_engine(routes, **kw)
    dsv4 = SimpleNamespace(experimental_attention_variant="dsv4_hybrid")
    assert rv._context_parallel_layout(dsv4) == "contiguous"


def test_verls_routing_patch_functions_are_refused_naming_the_rr_way() -> None:
    for fn in (rv.patched_routing, rv._patched_topk_routing_with_score_function):
        with pytest.raises(ReplayError, match="set_router_replay_data"):
            fn(None, torch.zeros(1, 1))


def test_rr_reads_the_names_it_calls_from_one_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """rr calls verl's helpers as attributes of ``_names.NAMES``: rr's function by default,
    what replaced it on rr_megatron_compat.verl while replaced; unknown names are refused."""
    names = rv._names.NAMES
    assert names.preprocess_packed_seqs is rv._packing.preprocess_packed_seqs
    assert names.get_current_rank_layer_info is rv.get_current_rank_layer_info

    def pack(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(rv, "preprocess_packed_seqs", pack)
    assert names.preprocess_packed_seqs is pack
    monkeypatch.undo()
    assert names.preprocess_packed_seqs is rv._packing.preprocess_packed_seqs
    with pytest.raises(TypeError, match=r"got \['nope'\]"):
        names.provide(nope=pack)
