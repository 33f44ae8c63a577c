"""Invalid layouts and arguments: each refused with a LayoutError that names the values.

Shape suffixes: T tokens, L all decoder layers, M MoE layers, K top-k.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rr_core import (  # what users call, from where they import it
    LayoutConfig,
    LayoutError,
    all_layers_to_moe_layers,
    is_moe_layer,
    layer_offset,
    moe_layers_to_all_layers,
    num_layers_to_build,
    select_stage,
    stage_of_layer,
)
from rr_core.layout.axis import axis_length

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
