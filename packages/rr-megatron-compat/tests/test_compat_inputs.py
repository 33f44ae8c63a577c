"""Every public entry point checks its arguments up front: a bad type, ndim, dtype, size or
layout raises a typed rr error naming what came, never an error from inside torch or megatron."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from packaging.version import Version

import rr_megatron_compat as rmc
import rr_megatron_compat.verl as rverl
from rr_core import (
    AlignmentError,
    LayoutConfig,
    LayoutError,
    ReplayController,
    ReplayError,
)
from rr_fakes.pytest_support import BadCall, over_bad_calls, raised_by

IDS = torch.zeros((4, 2, 2), dtype=torch.int16)
MASK = torch.ones(4, dtype=torch.bool)
CFG = LayoutConfig(num_layers=2, moe_layer_freq=1, pp_size=1)
PACKED = rmc.thd_pack([IDS])
CU = torch.tensor([0, 4], dtype=torch.int32)
#: compares equal to "zigzag" element-wise (truthy), so a ``==`` check would take it
ZIGZAG_ARRAY = np.array(["zigzag"])


def _attach_installed(controller: ReplayController, model: Any, **options: Any) -> Any:
    """``rr_megatron_compat.attach`` after ``install()`` (attach before install is refused
    first)."""
    rmc.install()
    try:
        return rmc.attach(controller, model, **options)
    finally:
        rmc.uninstall()


def _packed(**changes: Any) -> Any:
    fields = {
        "rows_TLK": IDS,
        "mask_T": MASK,
        "cu_seqlens": CU,
        "cu_seqlens_padded": CU,
        "max_seqlen": 4,
        **changes,
    }
    return rmc.PackedRoutes(**fields)


class _Config:
    num_layers = 2


CASES: list[BadCall] = [
    (
        "attach str controller",
        lambda: rmc.attach("ctl", torch.nn.Linear(1, 1)),
        ReplayError,
        "rr_core.ReplayController",
    ),
    (
        "attach str model",
        lambda: rmc.attach(ReplayController(num_experts=4, top_k=2), "model"),
        ReplayError,
        "nn.Module",
    ),
    (
        "attach capacity",
        lambda: _attach_installed(
            ReplayController(num_experts=4, top_k=2), torch.nn.Linear(1, 1), capacity="x"
        ),
        rmc.ReplayConfigError,
        "capacity",
    ),
    (
        "attach stats flag",
        lambda: _attach_installed(
            ReplayController(num_experts=4, top_k=2),
            torch.nn.Linear(1, 1),
            ignore_unreplayed_in_stats="no",
        ),
        ReplayError,
        "True or False",
    ),
    (
        "enable_replay capacity",
        lambda: rmc.enable_replay(object(), capacity="x"),
        rmc.ReplayConfigError,
        "'warn', 'raise', 'allow'",
    ),
    (
        "check_replay_config list",
        lambda: rmc.check_replay_config(None, capacity=["warn"]),
        rmc.ReplayConfigError,
        "list",
    ),
    (
        "batch_to_router_rows str",
        lambda: rmc.batch_to_router_rows("x"),
        AlignmentError,
        "torch.Tensor",
    ),
    (
        "batch_to_router_rows float",
        lambda: rmc.batch_to_router_rows(torch.zeros(1, 2, 2, 2)),
        AlignmentError,
        "integer dtype",
    ),
    (
        "router_rows_to_batch str",
        lambda: rmc.router_rows_to_batch("x", 1),
        AlignmentError,
        "torch.Tensor",
    ),
    (
        "router_rows_to_batch 2-D",
        lambda: rmc.router_rows_to_batch(IDS[:, 0], 1),
        AlignmentError,
        "3 dims",
    ),
    (
        "router_rows_to_batch float size",
        lambda: rmc.router_rows_to_batch(IDS, 2.0),
        AlignmentError,
        "batch_size must be an int",
    ),
    (
        "router_rows_to_batch str size",
        lambda: rmc.router_rows_to_batch(IDS, "2"),
        AlignmentError,
        "batch_size must be an int",
    ),
    ("sp_alignment str", lambda: rmc.sp_alignment("2"), AlignmentError, "tp_size"),
    ("sp_pad float cp", lambda: rmc.sp_pad(IDS, MASK, 2, 1.5), AlignmentError, "cp_size"),
    ("sp_scatter list", lambda: rmc.sp_scatter([1, 2], 0, 2), AlignmentError, "torch.Tensor"),
    ("sp_scatter str rank", lambda: rmc.sp_scatter(IDS, "0", 2), AlignmentError, "rank"),
    ("sp_gather ndarray", lambda: rmc.sp_gather(np.zeros(4)), AlignmentError, "ndarray"),
    (
        "cp_chunk_ids layout",
        lambda: rmc.cp_chunk_ids(0, 2, ZIGZAG_ARRAY),
        AlignmentError,
        "'zigzag', 'contiguous'",
    ),
    ("cp_chunk_ids float rank", lambda: rmc.cp_chunk_ids(0.0, 2), AlignmentError, "rank"),
    (
        "cp_split layout",
        lambda: rmc.cp_split(IDS, 0, 2, layout=ZIGZAG_ARRAY),
        AlignmentError,
        "CP layout",
    ),
    ("cp_split str", lambda: rmc.cp_split("seq", 0, 2), AlignmentError, "torch.Tensor"),
    ("cp_split dim", lambda: rmc.cp_split(IDS, 0, 2, dim=5), AlignmentError, "dim=5"),
    ("cp_merge tensor", lambda: rmc.cp_merge(IDS), AlignmentError, "one tensor per CP rank"),
    ("cp_merge empty", lambda: rmc.cp_merge([]), AlignmentError, "non-empty"),
    ("cp_merge list of str", lambda: rmc.cp_merge(["a", "b"]), AlignmentError, "rank 0"),
    (
        "cp_merge layout",
        lambda: rmc.cp_merge([IDS], layout=ZIGZAG_ARRAY),
        AlignmentError,
        "CP layout",
    ),
    (
        "cp_gather layout",
        lambda: rmc.cp_gather(IDS, object(), layout="x"),
        AlignmentError,
        "CP layout",
    ),
    ("thd_pack tensor", lambda: rmc.thd_pack(IDS), AlignmentError, "list of [T_i, L, K]"),
    ("thd_pack float routes", lambda: rmc.thd_pack([IDS.float()]), AlignmentError, "integer dtype"),
    ("thd_pack float align", lambda: rmc.thd_pack([IDS], align=2.0), AlignmentError, "align"),
    ("thd_unpack dict", lambda: rmc.thd_unpack({}), AlignmentError, "PackedRoutes"),
    ("thd_cp_index list", lambda: rmc.thd_cp_index([0, 4], 0, 1), AlignmentError, "torch.Tensor"),
    (
        "thd_cp_index float",
        lambda: rmc.thd_cp_index(CU.float(), 0, 1),
        AlignmentError,
        "integer dtype",
    ),
    (
        "packed_seq_params tuple",
        lambda: rmc.packed_seq_params((IDS,)),
        AlignmentError,
        "PackedRoutes",
    ),
    (
        "PackedRoutes float rows",
        lambda: _packed(rows_TLK=IDS.float()),
        AlignmentError,
        "integer dtype",
    ),
    ("PackedRoutes int mask", lambda: _packed(mask_T=MASK.int()), AlignmentError, "bool"),
    ("PackedRoutes short mask", lambda: _packed(mask_T=MASK[:2]), AlignmentError, "2 rows"),
    ("PackedRoutes float cu", lambda: _packed(cu_seqlens=CU.float()), AlignmentError, "cu_seqlens"),
    ("PackedRoutes str max", lambda: _packed(max_seqlen="4"), AlignmentError, "max_seqlen"),
    (
        "count_routed_tokens list",
        lambda: rmc.count_routed_tokens([[True]]),
        ReplayError,
        "torch.Tensor",
    ),
    (
        "all_gather_exact float",
        lambda: rmc.all_gather_exact(torch.zeros(2), object()),
        AlignmentError,
        "integer or bool",
    ),
    (
        "all_gather_exact list",
        lambda: rmc.all_gather_exact([1, 2], object()),
        AlignmentError,
        "list",
    ),
    ("install force str", lambda: rmc.install(force="yes"), ReplayError, "True or False"),
    (
        "line_flags garbage",
        lambda: rmc.line_flags("not a version"),
        rmc.UnsupportedMegatronError,
        "not a megatron-core version",
    ),
    (
        "line_flags float",
        lambda: rmc.line_flags(0.16),
        rmc.UnsupportedMegatronError,
        "version string",
    ),
    (
        "hook_specs str",
        lambda: rmc.hook_specs("0.16"),
        rmc.UnsupportedMegatronError,
        "MegatronLine",
    ),
    (
        "parse_moe_layer_freq float layers",
        lambda: rmc.parse_moe_layer_freq(1, 2.0),
        LayoutError,
        "num_layers",
    ),
    ("layout_config no num_layers", lambda: rmc.layout_config(object()), LayoutError, "num_layers"),
    (
        "layout_config str pp",
        lambda: rmc.layout_config(_Config(), pp_size="2"),
        LayoutError,
        "pp_size",
    ),
    (
        "layout_config float vp",
        lambda: rmc.layout_config(_Config(), vp_size=2.5),
        LayoutError,
        "vp_size",
    ),
    (
        "rank_moe_layer_numbers dict cfg",
        lambda: rmc.rank_moe_layer_numbers({}, 0),
        LayoutError,
        "LayoutConfig",
    ),
    (
        "stack_rank_routes list",
        lambda: rmc.stack_rank_routes([IDS], CFG, 0),
        LayoutError,
        "layer_number",
    ),
    (
        "stack_rank_routes float",
        lambda: rmc.stack_rank_routes({1: torch.zeros(4, 2)}, CFG, 0),
        LayoutError,
        "integer dtype",
    ),
    (
        "merge_stage_routes bad key",
        lambda: rmc.merge_stage_routes({0: IDS}, CFG),
        LayoutError,
        "(pp_rank, vp_stage)",
    ),
    (
        "split_rank_routes None",
        lambda: rmc.split_rank_routes(None, CFG, 0),
        LayoutError,
        "routes_TmK is None",
    ),
    (
        "split_rank_routes 2-D",
        lambda: rmc.split_rank_routes(IDS[:, 0], CFG, 0),
        LayoutError,
        "3 dims",
    ),
    (
        "pp_gather float dtype",
        lambda: rmc.pp_gather(IDS, CFG, object(), dtype=torch.float32),
        LayoutError,
        "integer torch.dtype",
    ),
    (
        "verl set_router_replay_data list",
        lambda: rverl.set_router_replay_data([[1]], None, None),
        ReplayError,
        "torch.Tensor",
    ),
    (
        "verl set_router_replay_data float",
        lambda: rverl.set_router_replay_data(torch.zeros(1, 2, 2, 2), None, None),
        ReplayError,
        "integer dtype",
    ),
    (
        "verl set_router_replay_data vp_rank",
        lambda: rverl.set_router_replay_data(IDS[None], None, None, vp_rank="0"),
        ReplayError,
        "vp_rank",
    ),
    (
        "verl merge_router_topk_indices list",
        lambda: rverl.merge_router_topk_indices(
            None, torch.zeros(1, 2, dtype=torch.long), (), None
        ),
        ReplayError,
        "must be a list",
    ),
    (
        "verl merge_nested_router_maps tensor",
        lambda: rverl.merge_nested_router_maps(IDS),
        ReplayError,
        "list of jagged",
    ),
    (
        "verl merge_nested_router_maps str",
        lambda: rverl.merge_nested_router_maps(["x"]),
        ReplayError,
        "torch.Tensor",
    ),
    (
        "verl set_model_router_replay_action str",
        lambda: rverl.set_model_router_replay_action(torch.nn.Linear(1, 1), "record"),
        ReplayError,
        "(RECORD, REPLAY_FORWARD, REPLAY_BACKWARD)",
    ),
    (
        "verl iter_model_routers str",
        lambda: list(rverl.iter_model_routers("m")),
        ReplayError,
        "nn.Module",
    ),
    (
        "verl is_moe_layer float",
        lambda: rverl.is_moe_layer(_Config(), 1.0),
        LayoutError,
        "layer_idx",
    ),
    (
        "verl align_r3 list",
        lambda: rverl.align_r3_router_replay_data([1], IDS),
        AlignmentError,
        "torch.Tensor",
    ),
    (
        "verl build_r3_replay_mask str",
        lambda: rverl.build_r3_replay_mask("x", IDS),
        AlignmentError,
        "torch.Tensor",
    ),
    (
        "verl reorder tensor",
        lambda: rverl.reorder_and_merge_vpp_layers(IDS, 1, 1, 1),
        LayoutError,
        "list of captured",
    ),
    (
        "verl reorder float",
        lambda: rverl.reorder_and_merge_vpp_layers([], 1.0, 1, 1),
        LayoutError,
        "num_microbatches",
    ),
    (
        "verl get_num_layers_to_build str vp",
        lambda: rverl.get_num_layers_to_build(_Config(), vp_stage="0", pp_rank=0),
        LayoutError,
        "vp_stage must be an int",
    ),
]


@over_bad_calls(CASES)
def test_bad_arguments_raise_a_typed_rr_error(
    call: Callable[[], Any], error: type[Exception], fragment: str
) -> None:
    raised_by(call, error, fragment)


def test_integer_scalars_of_numpy_and_torch_are_sizes() -> None:
    rows = rmc.batch_to_router_rows(IDS.reshape(2, 2, 2, 2))
    assert rmc.router_rows_to_batch(rows, np.int64(2)).shape == (2, 2, 2, 2)
    assert rmc.cp_chunk_ids(torch.tensor(1), np.int32(2)) == (1, 2)
    assert rmc.sp_alignment(np.int64(2), torch.tensor(2)) == 8
    assert rmc.line_flags(Version("0.16.0")).native_replay


def test_attach_a_real_model_with_a_string_controller(megatron: None) -> None:
    from compat_megatron_steps import build

    model = build()
    with pytest.raises(ReplayError, match=r"rr_core\.ReplayController"):
        rmc.attach("ctl", model)
    with pytest.raises(ReplayError, match=r"rr_core\.ReplayController"):
        rmc.attach(None, [model])
