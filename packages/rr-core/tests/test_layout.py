"""Layer layout and index math, checked against an independent brute force and by hand.

Shape suffixes: T tokens, L all decoder layers, M MoE layers, K top-k.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rr_core.errors import LayoutError
from rr_core.layout.axis import (
    all_layers_to_moe_layers,
    axis_length,
    moe_layers_to_all_layers,
    select_stage,
)
from rr_core.layout.pipeline import (
    LayoutConfig,
    dense_layer_numbers,
    is_moe_layer,
    layer_offset,
    moe_layer_numbers,
    moe_ordinal,
    moe_ordinals_of_stage,
    moe_pattern,
    num_layers_to_build,
    num_moe_layers,
    stage_layer_numbers,
    stage_moe_layer_numbers,
    stage_of_layer,
    virtual_stage_layer_counts,
)

Stage = tuple[int, int | None]
PROPERTY = settings(max_examples=150, deadline=None)

# --- independent reference -----------------------------------------------------------------------


def ref_moe_flags(cfg: LayoutConfig) -> list[bool]:
    """Megatron's rule, restated: int N -> 0-based i is MoE iff i % N == 0; list -> entry == 1."""
    freq = cfg.moe_layer_freq
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(cfg.num_layers)]
    return [v == 1 for v in freq]


def stages_in_order(cfg: LayoutConfig) -> list[Stage]:
    """Every (pp_rank, vp_stage) in the order Megatron lays layers out: vp_stage, then pp_rank."""
    if cfg.vp_size is None:
        return [(p, None) for p in range(cfg.pp_size)]
    return [(p, v) for v in range(cfg.vp_size) for p in range(cfg.pp_size)]


def ref_count(cfg: LayoutConfig, pp_rank: int, vp_stage: int | None) -> int:
    """Megatron's get_num_layers_to_build, written per call from first/last-stage flags."""
    vp = cfg.vp_size or 1
    if cfg.stage_layer_counts is not None:
        return cfg.stage_layer_counts[(vp_stage or 0) * cfg.pp_size + pp_rank]
    is_first, is_last = pp_rank == 0, pp_rank == cfg.pp_size - 1
    if cfg.first_stage_layers is not None or cfg.last_stage_layers is not None:
        rest, stages_left = cfg.num_layers, cfg.pp_size
        if cfg.first_stage_layers is not None:
            rest, stages_left = rest - cfg.first_stage_layers, stages_left - 1
        if cfg.last_stage_layers is not None:
            rest, stages_left = rest - cfg.last_stage_layers, stages_left - 1
        per_rank = rest // stages_left if stages_left else 0
        if is_first and cfg.first_stage_layers is not None:
            per_rank = cfg.first_stage_layers
        if is_last and cfg.last_stage_layers is not None:
            per_rank = cfg.last_stage_layers
    else:
        total = cfg.num_layers
        total += cfg.account_for_embedding_in_pipeline_split
        total += cfg.account_for_loss_in_pipeline_split
        per_rank = total // cfg.pp_size
    n = per_rank // vp if cfg.pp_size > 1 else per_rank
    if is_first and (vp_stage or 0) == 0 and cfg.account_for_embedding_in_pipeline_split:
        n -= 1
    if is_last and (vp_stage or 0) == vp - 1 and cfg.account_for_loss_in_pipeline_split:
        n -= 1
    return n


def ref_megatron_offset(cfg: LayoutConfig, pp_rank: int, vp_stage: int | None) -> int:
    """Megatron's get_transformer_layer_offset closed forms (computed splits only)."""
    if cfg.pp_size == 1:
        return 0
    first, last = cfg.first_stage_layers, cfg.last_stage_layers
    vp = cfg.vp_size
    if first is not None or last is not None:
        middle_stages = cfg.pp_size - (first is not None) - (last is not None)
        middle_layers = cfg.num_layers - (first or 0) - (last or 0)
        middle_rank = pp_rank if first is None else pp_rank - 1
        if vp is not None:
            assert vp_stage is not None
            first_chunk, last_chunk = (first or 0) // vp, (last or 0) // vp
            middle_chunk = middle_layers // vp
            per_vstage = first_chunk + middle_chunk + last_chunk
            if pp_rank == 0:
                return vp_stage * per_vstage
            # Megatron divides by middle_stages here even when it is 0 (pp=2, both edges set).
            per_middle_rank = middle_chunk // middle_stages if middle_stages else 0
            return vp_stage * per_vstage + first_chunk + middle_rank * per_middle_rank
        if pp_rank == 0:
            return 0
        return middle_rank * (middle_layers // middle_stages if middle_stages else 0) + (first or 0)
    total = cfg.num_layers
    total += cfg.account_for_embedding_in_pipeline_split + cfg.account_for_loss_in_pipeline_split
    per_rank = total // cfg.pp_size
    at_first_stage = pp_rank == 0 and (vp_stage or 0) == 0
    emb_shift = int(cfg.account_for_embedding_in_pipeline_split and not at_first_stage)
    if vp is not None:
        assert vp_stage is not None
        return vp_stage * (total // vp) + pp_rank * (per_rank // vp) - emb_shift
    return pp_rank * per_rank - emb_shift


def deal(cfg: LayoutConfig) -> dict[Stage, list[int]]:
    """Deal layers 1..num_layers one at a time to the stages in order, by the reference counts."""
    dealt: dict[Stage, list[int]] = {}
    layer = 1
    for stage in stages_in_order(cfg):
        dealt[stage] = []
        for _ in range(ref_count(cfg, *stage)):
            dealt[stage].append(layer)
            layer += 1
    return dealt


# --- valid configs, built constructively ---------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> LayoutConfig:
    """A valid config: even split (with embedding/loss accounting), uneven edges, or explicit."""
    pp = draw(st.integers(1, 8))
    mode = draw(st.sampled_from(["even", "uneven", "explicit"] if pp > 1 else ["even", "explicit"]))
    max_vp = 4 if pp > 1 or mode == "explicit" else 1
    vp = draw(st.none() | st.integers(1, max_vp))
    v = vp or 1
    kw: dict[str, Any] = {"pp_size": pp, "vp_size": vp}
    if mode == "even":
        emb, loss = draw(st.booleans()), draw(st.booleans())
        chunk = draw(st.integers(1, 3))
        num_layers = pp * v * chunk - emb - loss
        if pp * v == 1:
            assume(chunk >= emb + loss)
        assume(num_layers >= 1)
        kw |= {
            "account_for_embedding_in_pipeline_split": emb,
            "account_for_loss_in_pipeline_split": loss,
        }
    elif mode == "uneven":
        first = draw(st.none() | st.integers(1, 3).map(lambda a: a * v))
        last = draw(st.none() | st.integers(1, 3).map(lambda b: b * v))
        assume(first is not None or last is not None)
        middle_stages = pp - (first is not None) - (last is not None)
        middle_chunk = draw(st.integers(0, 3)) if middle_stages else 0
        num_layers = (first or 0) + (last or 0) + middle_stages * v * middle_chunk
        kw |= {"first_stage_layers": first, "last_stage_layers": last}
    else:
        counts = draw(st.lists(st.integers(0, 3), min_size=pp * v, max_size=pp * v))
        num_layers = sum(counts)
        assume(num_layers >= 1)
        kw["stage_layer_counts"] = counts if draw(st.booleans()) else tuple(counts)
    freq = draw(
        st.integers(1, 5)
        | st.lists(st.integers(0, 1), min_size=num_layers, max_size=num_layers)
        | st.lists(st.integers(0, 1), min_size=num_layers, max_size=num_layers).map(tuple)
    )
    return LayoutConfig(num_layers=num_layers, moe_layer_freq=freq, **kw)


# --- properties ----------------------------------------------------------------------------------


@PROPERTY
@given(layouts())
def test_stages_partition_layers_like_the_reference(cfg: LayoutConfig) -> None:
    dealt = deal(cfg)
    every = [n for layers in dealt.values() for n in layers]
    assert sorted(every) == list(range(1, cfg.num_layers + 1))
    assert len(every) == len(set(every)) == cfg.num_layers
    assert list(virtual_stage_layer_counts(cfg)) == [len(ls) for ls in dealt.values()]
    for (pp_rank, vp_stage), layers in dealt.items():
        assert num_layers_to_build(cfg, pp_rank, vp_stage) == len(layers)
        assert stage_layer_numbers(cfg, pp_rank, vp_stage) == tuple(layers)
        offset = layer_offset(cfg, pp_rank, vp_stage)
        if layers:
            assert offset == layers[0] - 1
        if cfg.stage_layer_counts is None and layers:
            assert offset == ref_megatron_offset(cfg, pp_rank, vp_stage)
        for n in layers:
            assert stage_of_layer(cfg, n) == (pp_rank, vp_stage)


@PROPERTY
@given(layouts())
def test_moe_ordinals_count_only_moe_layers(cfg: LayoutConfig) -> None:
    flags = ref_moe_flags(cfg)
    assert moe_pattern(cfg) == tuple(flags)
    moe_numbers = [i + 1 for i, f in enumerate(flags) if f]
    assert moe_layer_numbers(cfg) == tuple(moe_numbers)
    assert dense_layer_numbers(cfg) == tuple(i + 1 for i, f in enumerate(flags) if not f)
    assert num_moe_layers(cfg) == axis_length(cfg, "moe_layers") == len(moe_numbers)
    for j, n in enumerate(moe_numbers):
        assert is_moe_layer(cfg, n)
        assert moe_ordinal(cfg, n) == j
    gathered: list[int] = []
    for (pp_rank, vp_stage), layers in deal(cfg).items():
        stage_moe = [n for n in layers if flags[n - 1]]
        assert stage_moe_layer_numbers(cfg, pp_rank, vp_stage) == tuple(stage_moe)
        ordinals = moe_ordinals_of_stage(cfg, pp_rank, vp_stage)
        assert ordinals == tuple(moe_numbers.index(n) for n in stage_moe)
        gathered.extend(ordinals)
    assert gathered == list(range(len(moe_numbers)))


@PROPERTY
@given(layouts(), st.sampled_from([torch.uint8, torch.int16, torch.int64]), st.data())
def test_axis_conversions_round_trip(
    cfg: LayoutConfig, dtype: torch.dtype, data: st.DataObject
) -> None:
    lead = data.draw(st.sampled_from([(), (3,), (2, 3)]))
    k, fill = 2, 7
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    routes_TLK = torch.randint(0, 100, (*lead, cfg.num_layers, k), generator=g).to(dtype)
    mask = torch.tensor(ref_moe_flags(cfg))

    routes_TMK = all_layers_to_moe_layers(routes_TLK, cfg)
    assert routes_TMK.dtype == dtype
    assert routes_TMK.device == routes_TLK.device
    assert torch.equal(routes_TMK, routes_TLK[..., mask, :])

    back_TLK = moe_layers_to_all_layers(routes_TMK, cfg, fill=fill)
    assert back_TLK.shape == routes_TLK.shape
    assert back_TLK.dtype == dtype
    assert torch.equal(back_TLK[..., mask, :], routes_TLK[..., mask, :])
    assert bool((back_TLK[..., ~mask, :] == fill).all())
    assert torch.equal(all_layers_to_moe_layers(back_TLK, cfg), routes_TMK)

    all_parts = [select_stage(routes_TLK, cfg, "all_layers", *s) for s in stages_in_order(cfg)]
    assert torch.equal(torch.cat(all_parts, dim=-2), routes_TLK)
    for stage, part_TLK in zip(stages_in_order(cfg), all_parts, strict=True):
        moe_part = select_stage(routes_TMK, cfg, "moe_layers", *stage)
        assert torch.equal(moe_part, part_TLK[..., mask[part_index(cfg, stage)], :])


def part_index(cfg: LayoutConfig, stage: Stage) -> slice:
    start = layer_offset(cfg, *stage)
    return slice(start, start + num_layers_to_build(cfg, *stage))


@PROPERTY
@given(layouts(), st.data())
def test_vp_stage_is_required_exactly_with_vpp(cfg: LayoutConfig, data: st.DataObject) -> None:
    pp_rank = data.draw(st.integers(0, cfg.pp_size - 1))
    if cfg.vp_size is None:
        with pytest.raises(LayoutError, match="vp_size is None"):
            layer_offset(cfg, pp_rank, 0)
    else:
        with pytest.raises(LayoutError, match="vp_stage is None"):
            layer_offset(cfg, pp_rank)
        with pytest.raises(LayoutError, match="vp_stage"):
            num_layers_to_build(cfg, pp_rank, cfg.vp_size)
    with pytest.raises(LayoutError, match="pp_rank"):
        stage_layer_numbers(cfg, cfg.pp_size, 0 if cfg.vp_size else None)


@PROPERTY
@given(st.integers(2, 8), st.integers(1, 40), st.booleans(), st.booleans())
def test_even_split_refuses_indivisible_layer_counts(
    pp: int, num_layers: int, emb: bool, loss: bool
) -> None:
    total = num_layers + emb + loss
    kw: dict[str, Any] = {
        "account_for_embedding_in_pipeline_split": emb,
        "account_for_loss_in_pipeline_split": loss,
    }
    if total % pp:
        with pytest.raises(LayoutError, match=f"not divisible by pp_size={pp}"):
            LayoutConfig(num_layers=num_layers, pp_size=pp, **kw)
    else:
        cfg = LayoutConfig(num_layers=num_layers, pp_size=pp, **kw)
        assert sum(virtual_stage_layer_counts(cfg)) == num_layers


@PROPERTY
@given(layouts(), st.integers(-3, 3).filter(bool))
def test_explicit_counts_must_sum_to_num_layers(cfg: LayoutConfig, delta: int) -> None:
    counts = list(virtual_stage_layer_counts(cfg))
    assume(cfg.num_layers + delta >= 1)
    with pytest.raises(LayoutError, match="sum to"):
        LayoutConfig(
            num_layers=cfg.num_layers + delta,
            pp_size=cfg.pp_size,
            vp_size=cfg.vp_size,
            stage_layer_counts=counts,
        )


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


# --- invalid configs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_layers": 0}, "num_layers must be a positive int"),
        ({"num_layers": 2**70}, r"num_layers=1180591620717411303424 is above rr's limit of 65536"),
        ({"num_layers": 4, "pp_size": 0}, "pp_size must be a positive int"),
        ({"num_layers": 4, "vp_size": 0}, "vp_size must be a positive int"),
        ({"num_layers": 4, "moe_layer_freq": 0}, "moe_layer_freq must be a positive int"),
        ({"num_layers": 4, "moe_layer_freq": "[1]*4"}, "parse Megatron's string form"),
        ({"num_layers": 4, "moe_layer_freq": [1, 0, 1]}, "has 3 entries but num_layers=4"),
        ({"num_layers": 4, "moe_layer_freq": [1, 0, 2, 1]}, r"\(2, 2\)"),
        ({"num_layers": 4, "moe_layer_freq": [1, 0.5, 1, 1]}, "entries must be 0 or 1"),
        ({"num_layers": 9, "pp_size": 2}, "9 is not divisible by pp_size=2"),
        ({"num_layers": 8, "pp_size": 2, "vp_size": 3}, "not divisible by vp_size=3"),
        ({"num_layers": 8, "vp_size": 2}, "vp_size=2 with pp_size=1"),
        ({"num_layers": 8, "first_stage_layers": 2}, "need pp_size >= 2"),
        (
            {
                "num_layers": 8,
                "pp_size": 2,
                "first_stage_layers": 3,
                "account_for_loss_in_pipeline_split": True,
            },
            "cannot be combined",
        ),
        ({"num_layers": 10, "pp_size": 4, "first_stage_layers": 3}, "not divisible by 3"),
        ({"num_layers": 8, "pp_size": 2, "first_stage_layers": 9}, "leave -1 layers"),
        (
            {"num_layers": 8, "pp_size": 2, "first_stage_layers": 3, "last_stage_layers": 3},
            "leave 2 layers",
        ),
        (
            {"num_layers": 11, "pp_size": 3, "vp_size": 2, "first_stage_layers": 3},
            "pp_rank 0 gets 3 layers, not divisible by vp_size=2",
        ),
        ({"num_layers": 4, "pp_size": 2, "stage_layer_counts": [4]}, "needs 2"),
        ({"num_layers": 4, "pp_size": 2, "stage_layer_counts": [5, -1]}, "ints >= 0"),
        ({"num_layers": 4, "pp_size": 2, "stage_layer_counts": [2, 1]}, "sum to 3"),
        (
            {"num_layers": 4, "pp_size": 2, "stage_layer_counts": [2, 2], "last_stage_layers": 2},
            "would be ignored",
        ),
    ],
)
def test_invalid_configs_raise_with_the_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        LayoutConfig(**kwargs)


def test_layout_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.4"):
        is_moe_layer(LayoutConfig(num_layers=4), 0)
    with pytest.raises(LayoutError, match=r"layer axis must be one of .*got .experts."):
        axis_length(LayoutConfig(num_layers=4), "experts")  # type: ignore[arg-type]


@pytest.mark.parametrize("axis", ["MoE_layers", "", None, 0, ["all_layers"], b"all_layers"])
def test_select_stage_takes_exactly_a_layer_axis(axis: Any) -> None:
    with pytest.raises(LayoutError, match="layer axis must be one of 'all_layers', 'moe_layers'"):
        select_stage(torch.zeros(3, 2, 2), LayoutConfig(num_layers=2), axis, 0)


def test_layer_axis_conversions_take_tensors_only() -> None:
    cfg = LayoutConfig(num_layers=2)
    with pytest.raises(
        LayoutError, match=r"routes_TLK must be a torch.Tensor \[..., L, K\]; got list"
    ):
        all_layers_to_moe_layers([[[0, 1], [2, 3]]], cfg)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, 0.0, 1.0, "0", [0], True])
def test_ranks_layers_and_fill_must_be_ints(bad: Any) -> None:
    cfg = LayoutConfig(num_layers=4, pp_size=2, vp_size=2)
    for call, what in [
        (lambda: layer_offset(cfg, bad, 0), "pp_rank"),
        (lambda: num_layers_to_build(cfg, 0, bad), "vp_stage"),
        (lambda: stage_of_layer(cfg, bad), "layer_number"),
        (lambda: moe_layers_to_all_layers(torch.zeros(1, 4, 2), cfg, bad), "fill"),
    ]:
        if what == "vp_stage" and bad is None:
            continue  # None is "no VPP", refused with its own message below
        with pytest.raises(LayoutError, match=f"{what} must be an int; got"):
            call()
    with pytest.raises(LayoutError, match="vp_stage is None"):
        num_layers_to_build(cfg, 0, None)


@pytest.mark.parametrize("bad", [None, 2.5, object()])
def test_moe_layer_freq_of_the_wrong_type_raises(bad: Any) -> None:
    with pytest.raises(LayoutError, match="moe_layer_freq must be an int or a 0/1 sequence"):
        LayoutConfig(num_layers=4, moe_layer_freq=bad)


def test_layout_functions_take_a_layout_config() -> None:
    with pytest.raises(LayoutError, match="cfg must be a LayoutConfig; got dict"):
        layer_offset({"num_layers": 4}, 0)  # type: ignore[arg-type]
