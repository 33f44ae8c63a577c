"""Route batch validation: every structural and id error names sequence, row and layer (E1
included), and RouteMeta's own checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.batch import RouteBatch, RouteMeta

from rr_core_testing import good_route_rows, route_meta


def _raises(match: str, values: torch.Tensor, offsets: list[int], **kw: object) -> None:
    valid = kw.pop("valid", None)
    meta = kw.pop("meta", route_meta())
    with pytest.raises(RouteValidationError, match=match):
        RouteBatch(values, offsets, valid, meta, **kw)  # type: ignore[arg-type]


def test_valid_batch_passes() -> None:
    RouteBatch(good_route_rows(), [0, 2, 5], None, route_meta()).validate()


def test_values_must_be_3d_integer() -> None:
    _raises(r"3-D \[N, L, K\]; got shape \(5, 6\)", good_route_rows().view(5, 6), [0, 5])
    _raises("integer dtype; got torch.float32", good_route_rows().float(), [0, 5])


def test_layer_count_and_top_k_must_match_meta() -> None:
    _raises(
        r"L=2 layer slots but meta\.layer_numbers has 3 on the all_layers axis",
        good_route_rows()[:, 1:],
        [0, 5],
    )
    _raises(r"K=1 ids per row; meta\.top_k=2", good_route_rows()[..., :1], [0, 5])


def test_offsets_and_valid_must_be_consistent() -> None:
    _raises("start at 0 and end at N=5", good_route_rows(), [1, 5])
    _raises("start at 0 and end at N=5", good_route_rows(), [0, 4])
    _raises(r"decrease at sequence 1: 3 -> 2", good_route_rows(), [0, 3, 2, 5])
    _raises(
        r"valid_N must be a bool tensor \[N=5\]; got shape \(4,\)",
        good_route_rows(),
        [0, 5],
        valid=torch.ones(4, dtype=torch.bool),
    )
    _raises("valid_N must be a bool mask", good_route_rows(), [0, 5], valid=torch.ones(5))


@pytest.mark.parametrize(
    ("row", "slot", "ids", "message"),
    [
        pytest.param(
            3,
            2,
            [1, 8],
            r"sequence 1, token row 1 \(global row 3\), layer 3 \(slot 2\): expert ids "
            r"\[1, 8\] are outside \[0, 8\)",
            id="out of range",
        ),
        pytest.param(
            4,
            1,
            [6, 6],
            r"sequence 1, token row 2 \(global row 4\), layer 2 \(slot 1\): expert ids "
            r"\[6, 6\] repeat an id; a valid row needs top_k=2 distinct",
            id="repeated",
        ),
    ],
)
def test_bad_ids_name_sequence_row_and_layer(
    row: int, slot: int, ids: list[int], message: str
) -> None:
    v = good_route_rows()
    v[row, slot] = torch.tensor(ids)
    _raises(message, v, [0, 2, 5])


def test_out_of_range_int16_ids_name_sequence_row_and_layer() -> None:
    v16 = good_route_rows().to(torch.int16)
    v16[0, 1, 0] = -3
    _raises(r"sequence 0, token row 0 .* layer 2 .* \[-3, 2\]", v16, [0, 5], meta=route_meta(E=300))


def test_out_of_range_ids_on_invalid_rows_are_ignored() -> None:
    v = good_route_rows()
    v[3, 2] = torch.tensor([9, 9])
    valid = torch.tensor([True, True, True, False, True])
    RouteBatch(v, [0, 2, 5], valid, route_meta())


def test_nonzero_dense_slot_rejected() -> None:
    v = good_route_rows()
    v[1, 0, 1] = 3
    invalid_row = torch.tensor([True, False, True, True, True])
    _raises(
        r"sequence 0, token row 1 \(global row 1\), layer 1 \(slot 0, dense\): ids \[0, 3\] are "
        "non-zero",
        v,
        [0, 2, 5],
        valid=invalid_row,  # dense slots must be zero on invalid rows too
    )


def test_E1_all_zero_slot_rejected() -> None:
    v = good_route_rows()
    v[2:, 2] = 0
    _raises(
        r"sequence 1, layer 3 \(slot 2\): expert ids are all zero on all 3 valid rows .*E1",
        v,
        [0, 2, 5],
    )


def test_E1_all_zero_slot_allowed_with_flag() -> None:
    """A top-1 slot can route a short sequence to expert 0 for real; the flag accepts it."""
    meta = RouteMeta(num_experts=4, top_k=1, layer_axis="moe_layers", layer_numbers=(5, 7))
    v = torch.tensor([[[1], [0]], [[2], [0]]])
    rb = RouteBatch(v, [0, 2], None, meta, allow_all_zero=True)
    rb.validate(allow_all_zero=True)
    with pytest.raises(RouteValidationError, match="pass allow_all_zero=True"):
        rb.validate()


def test_E1_flag_does_not_accept_zero_rows_for_top_k_above_one() -> None:
    v = good_route_rows()
    v[2:, 2] = 0
    with pytest.raises(RouteValidationError, match="cannot be a real route"):
        RouteBatch(v, [0, 2, 5], None, route_meta())
    with pytest.raises(RouteValidationError, match=r"expert ids \[0, 0\] repeat an id"):
        RouteBatch(v, [0, 2, 5], None, route_meta(), allow_all_zero=True)


def test_E1_reported_before_duplicates_for_top_k_above_one() -> None:
    v = good_route_rows()
    v[:2, 1] = 0  # [0, 0] is also a repeated id
    _raises("sequence 0, layer 2 .* all zero", v, [0, 2, 5])


def test_E1_top_k_one_all_zero_slot_rejected() -> None:
    meta = RouteMeta(num_experts=4, top_k=1, layer_axis="moe_layers", layer_numbers=(5, 7))
    v = torch.tensor([[[1], [0]], [[2], [0]]])
    _raises(r"sequence 0, layer 7 \(slot 1\): expert ids are all zero", v, [0, 2], meta=meta)


def test_E1_ignores_invalid_rows_and_sequences_without_valid_rows() -> None:
    v = good_route_rows()
    v[2:, 2] = 0
    RouteBatch(v, [0, 2, 5], torch.tensor([1, 1, 0, 0, 0]).bool(), route_meta())
    v[0, 2] = 0  # a zero row is fine while another valid row of the sequence routes
    v[0, 2, 1] = 0
    with pytest.raises(RouteValidationError, match="repeat an id"):
        RouteBatch(v, [0, 2, 5], torch.tensor([1, 1, 0, 0, 0]).bool(), route_meta())


def test_validate_false_skips_id_checks_not_structure() -> None:
    v = good_route_rows()
    v[2:, 2] = 0
    rb = RouteBatch(v, [0, 2, 5], None, route_meta(), validate=False)
    with pytest.raises(RouteValidationError, match="E1"):
        rb.validate()
    _raises("K=1", good_route_rows()[..., :1], [0, 5], validate=False)


def test_from_sequences_names_the_bad_sequence() -> None:
    with pytest.raises(
        RouteValidationError, match=r"sequence 1 has shape \(2, 2, 2\); expected \[T, 3, 2\]"
    ):
        RouteBatch.from_sequences([good_route_rows(2), good_route_rows(2)[:, 1:]], route_meta())
    with pytest.raises(
        RouteValidationError, match=r"valid\[0\] has shape \(3,\); sequence 0 has 2"
    ):
        RouteBatch.from_sequences(
            [good_route_rows(2)], route_meta(), valid=[np.ones(3, dtype=bool)]
        )
    with pytest.raises(RouteValidationError, match="1 masks for 2 sequences"):
        RouteBatch.from_sequences(
            [good_route_rows(2), good_route_rows(2)], route_meta(), valid=[np.ones(2, dtype=bool)]
        )


def test_meta_validation() -> None:
    m = RouteMeta(
        num_experts=8,
        top_k=2,
        layer_axis="all_layers",
        layer_numbers=[1, 2],  # type: ignore[arg-type]
        moe_layer_numbers=np.array([1, 2]),  # type: ignore[arg-type]
    )
    assert m.layer_numbers == (1, 2)
    assert type(m.layer_numbers[0]) is int
    assert m.moe_layer_numbers is None  # every slot routed
    assert m == RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2))
    assert route_meta().moe_slots == (1, 2)
    assert route_meta().dense_slots == (0,)
    with pytest.raises(RouteValidationError, match="num_experts"):
        route_meta(E=0)
    with pytest.raises(RouteValidationError, match=r"top_k must be an int in \[1, num_experts=8\]"):
        route_meta(K=9)
    with pytest.raises(LayoutError, match="strictly increasing"):
        route_meta(layers=(2, 1), moe=None)
    with pytest.raises(LayoutError, match="consecutive"):
        route_meta(layers=(1, 3), moe=None)
    with pytest.raises(LayoutError, match="subset of layer_numbers"):
        route_meta(moe=(4,))
    with pytest.raises(LayoutError, match="must equal layer_numbers"):
        RouteMeta(
            num_experts=8,
            top_k=2,
            layer_axis="moe_layers",
            layer_numbers=(1, 2),
            moe_layer_numbers=(1,),
        )
    with pytest.raises(LayoutError, match="layer_axis"):
        RouteMeta(num_experts=8, top_k=2, layer_axis="layers", layer_numbers=(1,))  # type: ignore[arg-type]


def test_padded_length_errors() -> None:
    rb = RouteBatch(good_route_rows(), [0, 2, 5], None, route_meta())
    with pytest.raises(RouteValidationError, match="length=2 is shorter than the longest sequence"):
        rb.to_padded(length=2)
    with pytest.raises(ValueError, match="padding_side"):
        rb.to_padded("middle")  # type: ignore[arg-type]


def test_validation_in_blocks_reports_global_rows_and_total_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rr_core.routes.validate_ids as validate_ids

    monkeypatch.setattr(validate_ids, "_BLOCK_IDS", 12)  # two rows per block
    RouteBatch(good_route_rows(7), [0, 2, 7], None, route_meta())
    v = good_route_rows(7)
    v[3, 2, 1] = 9
    v[6, 1, 0] = 8
    _raises(r"sequence 1, token row 1 \(global row 3\).*2 row-layer pair\(s\)", v, [0, 2, 7])
    v = good_route_rows(7)
    v[2:, 2] = 0
    _raises(r"sequence 1, layer 3 \(slot 2\): expert ids are all zero on all 5", v, [0, 2, 7])
