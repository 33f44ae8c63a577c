"""Property sweep of the layout entry points (LayoutConfig, MoE layers, pipeline stages, layer
axes): a checked result or an RRError.

The invariant every sweep checks, and the list of swept names: test_core_sweep.py; the generated
input: rr_core_testing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rr_core
from rr_core import LayoutConfig, RRError
from rr_fakes.pytest_support import settles

from rr_core_testing import ANYTHING, JUNK, SWEEP, tensors


@st.composite
def layout_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    small = st.one_of(st.integers(-1, 8), JUNK) if draw(st.booleans()) else st.integers(1, 8)
    kwargs: dict[str, Any] = {"num_layers": draw(small)}
    if draw(st.booleans()):
        kwargs["pp_size"] = draw(small)
    if draw(st.booleans()):
        kwargs["vp_size"] = draw(st.one_of(st.none(), small))
    if draw(st.booleans()):
        kwargs["moe_layer_freq"] = draw(
            st.one_of(small, st.lists(st.integers(-1, 2), max_size=8), JUNK)
        )
    return kwargs


@SWEEP
@given(kwargs=layout_kwargs(), layer=st.one_of(st.integers(-1, 10), JUNK), rank=ANYTHING)
def test_layout(kwargs: dict[str, Any], layer: Any, rank: Any) -> None:
    try:
        cfg = LayoutConfig(**kwargs)
    except RRError:
        return
    except TypeError as e:  # an unknown keyword is Python's own refusal
        pytest.fail(f"LayoutConfig({kwargs}) raised {e!r}")
    ok, moe = settles(rr_core.moe_layer_numbers, cfg)
    if not ok:
        return
    assert all(1 <= n <= cfg.num_layers for n in moe)
    ok, is_moe = settles(rr_core.is_moe_layer, cfg, layer)
    if ok:
        assert is_moe == (layer in moe)
    ok, ordinal = settles(rr_core.moe_ordinal, cfg, layer)
    if ok:
        assert moe[ordinal] == layer
    ok, stage = settles(rr_core.stage_of_layer, cfg, layer)
    if ok:
        assert layer in rr_core.stage_layer_numbers(cfg, stage[0], stage[1])
    ok, numbers = settles(rr_core.stage_layer_numbers, cfg, rank)
    if ok:
        assert len(numbers) == rr_core.num_layers_to_build(cfg, rank)
        if numbers:
            assert numbers[0] == rr_core.layer_offset(cfg, rank) + 1


@SWEEP
@given(
    num_layers=st.integers(1, 6),
    freq=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    routes=st.one_of(tensors(max_dims=4, high=8), JUNK),
    rank=st.one_of(st.integers(-1, 3), JUNK),
)
def test_axis_helpers(num_layers: int, freq: list[int], routes: Any, rank: Any) -> None:
    freq = freq[:num_layers]
    if not any(freq):
        freq[0] = 1
    cfg = LayoutConfig(num_layers=num_layers, moe_layer_freq=freq)
    ok, out = settles(rr_core.all_layers_to_moe_layers, routes, cfg)
    if ok:
        assert out.shape[-2] == sum(freq)
        back = rr_core.moe_layers_to_all_layers(out, cfg)
        moe = [i for i, f in enumerate(freq) if f]
        assert torch.equal(back[..., moe, :], routes[..., moe, :])
    ok, out = settles(rr_core.moe_layers_to_all_layers, routes, cfg)
    if ok:
        assert out.shape[-2] == num_layers
    for axis in ("all_layers", "moe_layers", "stage", None):
        ok, out = settles(rr_core.select_stage, routes, cfg, axis, rank)
        if ok:
            assert out.shape[-2] <= routes.shape[-2]
