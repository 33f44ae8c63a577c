"""Layer layout by hand-checked examples, and the layout failure modes A2 and A3.

Shape suffixes: T tokens, L all decoder layers, M MoE layers, K top-k.
"""

from __future__ import annotations

import pytest
import torch

from rr_core.errors import LayoutError
from rr_core.layout.axis import (
    all_layers_to_moe_layers,
    moe_layers_to_all_layers,
    select_stage,
)
from rr_core.layout.pipeline import (
    LayoutConfig,
    dense_layer_numbers,
    layer_offset,
    moe_layer_numbers,
    moe_ordinal,
    moe_ordinals_of_stage,
    num_moe_layers,
    stage_layer_numbers,
    stage_moe_layer_numbers,
    stage_of_layer,
    virtual_stage_layer_counts,
)

from rr_core_testing import stages_in_order

# --- hand-checked examples -----------------------------------------------------------------------


def test_vpp_layers_go_vp_stage_major() -> None:
    cfg = LayoutConfig(num_layers=8, pp_size=2, vp_size=2)
    assert stage_layer_numbers(cfg, 0, 0) == (1, 2)
    assert stage_layer_numbers(cfg, 1, 0) == (3, 4)
    assert stage_layer_numbers(cfg, 0, 1) == (5, 6)
    assert stage_layer_numbers(cfg, 1, 1) == (7, 8)
    assert stage_of_layer(cfg, 5) == (0, 1)
    assert layer_offset(cfg, 1, 1) == 6


def test_deepseek_v3_dense_first_list_freq() -> None:
    cfg = LayoutConfig(
        num_layers=61,
        moe_layer_freq=[0] * 3 + [1] * 58,
        pp_size=8,
        first_stage_layers=7,
        last_stage_layers=6,
    )
    assert cfg.moe_layer_freq == (0,) * 3 + (1,) * 58
    assert dense_layer_numbers(cfg) == (1, 2, 3)
    assert moe_layer_numbers(cfg) == tuple(range(4, 62))
    assert moe_ordinal(cfg, 4) == 0
    assert moe_ordinal(cfg, 61) == 57
    assert virtual_stage_layer_counts(cfg) == (7, 8, 8, 8, 8, 8, 8, 6)
    assert stage_moe_layer_numbers(cfg, 0) == (4, 5, 6, 7)
    assert moe_ordinals_of_stage(cfg, 0) == (0, 1, 2, 3)
    assert moe_ordinals_of_stage(cfg, 1) == tuple(range(4, 12))
    assert moe_ordinals_of_stage(cfg, 7) == tuple(range(52, 58))
    with pytest.raises(LayoutError, match="layer 2 is dense"):
        moe_ordinal(cfg, 2)
    with pytest.raises(LayoutError, match=r"outside 1\.\.61"):
        moe_ordinal(cfg, 62)


def _accounting(**sizes: int) -> LayoutConfig:
    """A layout whose pipeline split counts the embedding and the loss as a layer each."""
    return LayoutConfig(
        **sizes,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )


def test_embedding_and_loss_accounting_pp4_14_layers() -> None:
    cfg = _accounting(num_layers=14, pp_size=4)
    assert virtual_stage_layer_counts(cfg) == (3, 4, 4, 3)
    assert [layer_offset(cfg, r) for r in range(4)] == [0, 3, 7, 11]
    assert stage_layer_numbers(cfg, 3) == (12, 13, 14)


def test_embedding_and_loss_accounting_with_vpp() -> None:
    cfg = _accounting(num_layers=6, pp_size=2, vp_size=2)
    assert virtual_stage_layer_counts(cfg) == (1, 2, 2, 1)
    assert [layer_offset(cfg, p, v) for p, v in stages_in_order(cfg)] == [0, 1, 3, 5]


def test_uneven_first_last_with_vpp() -> None:
    cfg = LayoutConfig(
        num_layers=12, pp_size=4, vp_size=2, first_stage_layers=2, last_stage_layers=2
    )
    assert [stage_layer_numbers(cfg, p, v) for p, v in stages_in_order(cfg)] == [
        (1,),
        (2, 3),
        (4, 5),
        (6,),
        (7,),
        (8, 9),
        (10, 11),
        (12,),
    ]
    assert layer_offset(cfg, 2, 1) == 9


def test_lists_are_stored_as_tuples_and_configs_hash() -> None:
    a = LayoutConfig(num_layers=4, moe_layer_freq=[1, 0, 1, 0], stage_layer_counts=[4])
    b = LayoutConfig(num_layers=4, moe_layer_freq=(1, 0, 1, 0), stage_layer_counts=(4,))
    assert a == b
    assert hash(a) == hash(b)
    assert isinstance(a.stage_layer_counts, tuple)


# --- named failure modes -------------------------------------------------------------------------


def test_A2_dense_first_conversion_does_not_shift_moe_slots() -> None:
    """Engines report all layers, trainer routers sit on MoE layers only: slot j is layer j+4."""
    cfg = LayoutConfig(num_layers=61, moe_layer_freq=[0] * 3 + [1] * 58)
    layer_ids_L = torch.arange(1, 62, dtype=torch.int16)
    routes_TLK = layer_ids_L.view(1, 61, 1).expand(5, 61, 2).clone()
    routes_TLK[:, :3] = 0  # dense rows carry no route
    routes_TMK = all_layers_to_moe_layers(routes_TLK, cfg)
    assert routes_TMK.shape == (5, 58, 2)
    assert routes_TMK[0, :, 0].tolist() == list(moe_layer_numbers(cfg))
    assert torch.equal(moe_layers_to_all_layers(routes_TMK, cfg), routes_TLK)


def test_A2_dense_first_refuses_the_wrong_axis() -> None:
    """Feeding a moe-axis tensor where the all-layers axis is expected must raise, not shift."""
    cfg = LayoutConfig(num_layers=61, moe_layer_freq=[0] * 3 + [1] * 58)
    with pytest.raises(LayoutError, match=r"all_layers axis .* has 61 slots"):
        all_layers_to_moe_layers(torch.zeros(5, 58, 8, dtype=torch.uint8), cfg)
    with pytest.raises(LayoutError, match=r"moe_layers axis .* has 58 slots"):
        moe_layers_to_all_layers(torch.zeros(5, 61, 8, dtype=torch.uint8), cfg)
    with pytest.raises(LayoutError, match="has 58 slots"):
        select_stage(torch.zeros(5, 61, 8), cfg, "moe_layers", 0)


def test_A3_mixed_dense_moe_vpp_offsets_count_moe_layers() -> None:
    """With every other layer dense, (pp1, vp0) starts at MoE slot 2, not at its layer offset 4."""
    cfg = LayoutConfig(num_layers=16, moe_layer_freq=2, pp_size=2, vp_size=2)
    assert stage_layer_numbers(cfg, 1, 0) == (5, 6, 7, 8)
    assert stage_moe_layer_numbers(cfg, 1, 0) == (5, 7)
    assert moe_ordinals_of_stage(cfg, 1, 0) == (2, 3)
    assert moe_ordinals_of_stage(cfg, 0, 1) == (4, 5)
    assert layer_offset(cfg, 1, 0) == 4


def test_A3_mixed_dense_moe_vpp_gather_in_global_layer_order() -> None:
    """Per-stage MoE slices concatenated in layer order rebuild the axis; pp-rank-major does not."""
    cfg = LayoutConfig(num_layers=16, moe_layer_freq=[0, 0] + [1, 0] * 7, pp_size=2, vp_size=2)
    routes_TMK = torch.arange(num_moe_layers(cfg)).view(1, -1, 1).expand(3, -1, 2)
    layer_order = [
        select_stage(routes_TMK, cfg, "moe_layers", p, v) for p, v in stages_in_order(cfg)
    ]
    assert torch.equal(torch.cat(layer_order, dim=-2), routes_TMK)
    rank_major = [
        select_stage(routes_TMK, cfg, "moe_layers", p, v) for p in range(2) for v in range(2)
    ]
    assert not torch.equal(torch.cat(rank_major, dim=-2), routes_TMK)


def test_A3_dense_only_stage_selects_no_slots() -> None:
    """A stage with only dense layers holds no MoE slots (yet still takes part in gathers)."""
    cfg = LayoutConfig(num_layers=8, moe_layer_freq=[0] * 3 + [1] * 5, pp_size=4)
    assert moe_ordinals_of_stage(cfg, 0) == ()
    assert moe_ordinals_of_stage(cfg, 1) == (0,)
    routes_TMK = torch.zeros(4, 5, 2, dtype=torch.uint8)
    assert select_stage(routes_TMK, cfg, "moe_layers", 0).shape == (4, 0, 2)
