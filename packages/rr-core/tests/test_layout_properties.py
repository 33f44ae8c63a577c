"""Layer layout and index math on generated configs, checked against an independent brute force.

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

from rr_core_testing import Stage, stages_in_order

PROPERTY = settings(max_examples=150, deadline=None)

# --- independent reference -----------------------------------------------------------------------


def ref_moe_flags(cfg: LayoutConfig) -> list[bool]:
    """Megatron's rule, restated: int N -> 0-based i is MoE iff i % N == 0; list -> entry == 1."""
    freq = cfg.moe_layer_freq
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(cfg.num_layers)]
    return [v == 1 for v in freq]


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
