"""Expert id dtypes: narrowing to the narrowest exact dtype, refusing ids it would wrap (E4), and
which dtypes hold every id below E."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rr_core
from rr_core.errors import RouteValidationError
from rr_core.routes.batch import RouteBatch, RouteMeta, narrow_ids, narrowest_dtype

from rr_core_testing import EXPERT_COUNTS


@pytest.mark.parametrize("E", EXPERT_COUNTS)
def test_narrowing_across_expert_counts(E: int) -> None:
    expected = torch.uint8 if E <= 256 else torch.int16
    assert narrowest_dtype(E) == expected
    ids = np.array([[[0, E - 1]]], dtype=np.int32)
    out = narrow_ids(ids, E)
    assert out.dtype == expected
    assert out.to(torch.int64).tolist() == [[[0, E - 1]]]
    meta = RouteMeta(num_experts=E, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))
    assert RouteBatch.from_sequences([ids], meta).values_NLK.dtype == expected


def test_narrowest_dtype_boundaries() -> None:
    assert narrowest_dtype(256) == torch.uint8
    assert narrowest_dtype(257) == torch.int16
    assert narrowest_dtype(32768) == torch.int16
    assert narrowest_dtype(32769) == torch.int32
    with pytest.raises(RouteValidationError):
        narrowest_dtype(0)


def test_E4_uint8_overflow_rejected_when_ids_exceed_the_target() -> None:
    with pytest.raises(
        RouteValidationError, match=r"torch\.uint8.*torch\.int64 has min 1, max 300"
    ):
        narrow_ids(torch.tensor([1, 300]), 256)


def test_E4_uint8_overflow_source_dtype_too_small_for_expert_count() -> None:
    wrapped = np.array([[[3, 200]]], dtype=np.uint8)  # 384-expert ids stored as uint8
    with pytest.raises(RouteValidationError, match=r"arrive as torch\.uint8.*ids up to 383"):
        narrow_ids(wrapped, 384)
    meta = RouteMeta(num_experts=384, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))
    with pytest.raises(RouteValidationError, match=r"sequence 0: .*E4"):
        RouteBatch.from_sequences([wrapped], meta)


def test_E4_negative_sentinel_does_not_wrap_into_uint8() -> None:
    with pytest.raises(RouteValidationError, match="min -1, max 5"):
        narrow_ids(np.array([-1, 5], dtype=np.int16), 8)


def test_narrow_ids_numpy_inputs() -> None:
    ro = np.array([1, 2, 3], dtype=np.int32)
    ro.setflags(write=False)
    out = narrow_ids(ro, 8)
    assert out.tolist() == [1, 2, 3]
    uint8_ro = np.array([4, 5], dtype=np.uint8)
    uint8_ro.setflags(write=False)
    same = narrow_ids(uint8_ro, 8)
    same[0] = 7  # a copy: the read-only source is untouched
    assert uint8_ro.tolist() == [4, 5]
    assert narrow_ids(np.array([1, 300], dtype=">i4"), 384).tolist() == [1, 300]
    assert narrow_ids(np.array([1, 383], dtype=np.uint16), 384).dtype == torch.int16
    assert narrow_ids(np.arange(6)[::-1], 8).tolist() == [5, 4, 3, 2, 1, 0]
    with pytest.raises(RouteValidationError, match="integer dtype"):
        narrow_ids(np.array([1.0]), 8)
    with pytest.raises(RouteValidationError, match="integer dtype"):
        narrow_ids(torch.tensor([True]), 8)


@pytest.mark.parametrize(
    ("dtype", "num_experts", "holds"),
    [
        (torch.uint8, 256, True),
        (torch.uint8, 257, False),
        (torch.int8, 128, True),
        (torch.int8, 129, False),
        (torch.int16, 32768, True),
        (torch.int16, 32769, False),
        (torch.int32, 32769, True),
        (torch.float32, 8, False),  # floats and bools hold no ids at all
        (torch.bool, 2, False),
    ],
)
def test_holds_ids_says_whether_every_id_below_e_fits(
    dtype: torch.dtype, num_experts: int, holds: bool
) -> None:
    assert rr_core.holds_ids(dtype, num_experts) is holds
