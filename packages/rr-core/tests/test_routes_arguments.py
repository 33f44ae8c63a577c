"""Route batch arguments: choices, indices, offsets and metas of the wrong type or value are
refused by name, never read as something else."""

from __future__ import annotations

import numpy as np
import pytest

from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.batch import RouteBatch, RouteMeta, narrowest_dtype

_CHOICE_LOOKALIKES = [
    "LEFT", "Right", "", " left", "moe", "all-layers", None, 1, True, b"left", ["left"],
    ("moe_layers",), np.array(["left", "right"]), np.array("left"),
]  # fmt: skip


def _small_batch() -> RouteBatch:
    meta = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2))
    return RouteBatch.from_sequences([np.array([[[0, 1], [2, 3]]] * 3)], meta)


@pytest.mark.parametrize("side", _CHOICE_LOOKALIKES)
def test_padding_side_takes_exactly_left_or_right(side: object) -> None:
    batch = _small_batch()
    for call in (batch.to_padded, batch.padded_token_mask):
        with pytest.raises(
            RouteValidationError, match="padding_side must be one of 'left', 'right'"
        ):
            call(side)  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [2.5, "4", True, np.array([4])])
def test_padded_length_must_be_an_int(length: object) -> None:
    with pytest.raises(RouteValidationError, match="length must be an int or None"):
        _small_batch().to_padded("right", length)  # type: ignore[arg-type]


@pytest.mark.parametrize("axis", _CHOICE_LOOKALIKES)
def test_layer_axis_takes_exactly_its_two_values(axis: object) -> None:
    with pytest.raises(LayoutError, match="must be one of 'all_layers', 'moe_layers'; got"):
        RouteMeta(num_experts=8, top_k=2, layer_axis=axis, layer_numbers=(1, 2))  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="axis must be one of 'all_layers', 'moe_layers'"):
        _small_batch().to_layer_axis(axis)  # type: ignore[arg-type]


def test_a_str_subclass_layer_axis_is_stored_as_a_plain_str() -> None:
    meta = RouteMeta(num_experts=8, top_k=2, layer_axis=np.str_("moe_layers"), layer_numbers=(1,))
    assert type(meta.layer_axis) is str
    assert meta == RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))


@pytest.mark.parametrize("bad", [None, 2.5, "8", True, [8]])
def test_expert_counts_and_indices_must_be_ints(bad: object) -> None:
    batch = _small_batch()
    with pytest.raises(RouteValidationError, match="num_experts must be an int"):
        narrowest_dtype(bad)  # type: ignore[arg-type]
    with pytest.raises(RouteValidationError, match="sequence index must be an int"):
        batch.sequence(bad)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="num_layers must be an int"):
        batch.to_layer_axis("all_layers", num_layers=bad if bad is not None else 2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, 3, "04", [0, 2.5], [0, None]])
def test_offsets_must_be_ints(bad: object) -> None:
    meta = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2))
    with pytest.raises(RouteValidationError, match="offset"):
        RouteBatch(np.zeros((4, 2, 2), np.uint8), bad, None, meta)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, {"num_experts": 8}, "meta"])
def test_a_route_batch_needs_a_route_meta(bad: object) -> None:
    with pytest.raises(RouteValidationError, match="meta must be a RouteMeta"):
        RouteBatch(np.zeros((4, 2, 2), np.uint8), [0, 4], None, bad)  # type: ignore[arg-type]
    with pytest.raises(RouteValidationError, match="meta must be a RouteMeta"):
        RouteBatch.from_sequences([np.zeros((4, 2, 2), np.uint8)], bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, 3, "seq"])
def test_from_sequences_needs_a_sequence(bad: object) -> None:
    meta = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2))
    with pytest.raises(RouteValidationError, match="seqs must be a sequence of"):
        RouteBatch.from_sequences(bad, meta)  # type: ignore[arg-type]
