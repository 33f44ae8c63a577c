"""Route batches: round trips, dtype narrowing (E4) and every validation error (E1 included)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rr_core
from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.axis import LayerAxis
from rr_core.routes.batch import RouteBatch, RouteMeta, narrow_ids, narrowest_dtype

LAYER_AXES_: tuple[LayerAxis, ...] = ("all_layers", "moe_layers")
EXPERT_COUNTS = (2, 8, 60, 64, 128, 160, 256, 257, 384, 512)
SETTINGS = settings(max_examples=100, deadline=None)


@dataclass
class Case:
    meta: RouteMeta
    seqs: list[npt.NDArray[np.int64]]
    valid: list[npt.NDArray[np.bool_]]


@st.composite
def cases(draw: st.DrawFn, axis: LayerAxis | None = None) -> Case:
    E = draw(st.sampled_from(EXPERT_COUNTS))
    K = draw(st.integers(1, min(4, E)))
    ax: LayerAxis = draw(st.sampled_from(LAYER_AXES_)) if axis is None else axis
    if ax == "all_layers":
        layers = list(range(1, draw(st.integers(1, 5)) + 1))
        moe = sorted(draw(st.sets(st.sampled_from(layers), min_size=1)))
    else:
        layers = moe = sorted(draw(st.sets(st.integers(1, 8), min_size=1, max_size=5)))
    meta = RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis=ax,
        layer_numbers=tuple(layers),
        moe_layer_numbers=tuple(moe),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = [i for i, n in enumerate(layers) if n in moe]
    seqs, valid = [], []
    for T in draw(st.lists(st.integers(0, 6), max_size=4)):
        ids = np.argsort(rng.random((T, len(slots), E)), axis=-1)[..., :K]
        if K == 1:  # a single all-zero slot would be an E1 signature; keep generated data clean
            ids = ids % (E - 1) + 1
        seq = np.zeros((T, len(layers), K), dtype=np.int64)
        seq[:, slots] = ids
        seqs.append(seq)
        valid.append(rng.random(T) < 0.8)
    return Case(meta, seqs, valid)


def _batch(case: Case) -> RouteBatch:
    return RouteBatch.from_sequences(case.seqs, case.meta, valid=case.valid)


def _meta(
    E: int = 8,
    K: int = 2,
    layers: tuple[int, ...] = (1, 2, 3),
    moe: tuple[int, ...] | None = (2, 3),
) -> RouteMeta:
    return RouteMeta(
        num_experts=E, top_k=K, layer_axis="all_layers", layer_numbers=layers, moe_layer_numbers=moe
    )


def _good(N: int = 5) -> torch.Tensor:
    """Rows of a 3-layer all_layers batch (layer 1 dense), K=2, every row distinct ids."""
    v = torch.zeros(N, 3, 2, dtype=torch.int64)
    v[:, 1:, 0] = 1
    v[:, 1:, 1] = (torch.arange(N) % 6 + 2)[:, None]
    return v


# --- round trips ------------------------------------------------------------------------------


@SETTINGS
@given(cases(), st.sampled_from(["left", "right"]), st.integers(0, 3))
def test_round_trip_padded(case: Case, side: str, extra: int) -> None:
    rb = _batch(case)
    longest = max((len(s) for s in case.seqs), default=0)
    padded, valid = rb.to_padded(side, length=longest + extra)  # type: ignore[arg-type]
    mask = rb.padded_token_mask(side, length=longest + extra)  # type: ignore[arg-type]
    assert padded.shape == (rb.num_sequences, longest + extra, *rb.values_NLK.shape[1:])
    assert not padded[~mask].any()
    assert not (valid & ~mask).any()
    assert RouteBatch.from_padded(padded, mask, case.meta, valid_BS=valid).equal(rb)


@SETTINGS
@given(cases())
def test_round_trip_nested(case: Case) -> None:
    rb = _batch(case)
    values_nt, valid_nt = rb.to_nested()
    assert values_nt.layout == torch.jagged
    assert RouteBatch.from_nested(values_nt, case.meta, valid_nt=valid_nt).equal(rb)
    for i in range(rb.num_sequences):
        values, valid = rb.sequence(i)
        assert torch.equal(values_nt[i], values)
        assert torch.equal(valid_nt[i], valid)


@SETTINGS
@given(cases())
def test_round_trip_sequences(case: Case) -> None:
    rb = _batch(case)
    assert rb.num_sequences == len(case.seqs)
    assert rb.num_tokens == sum(len(s) for s in case.seqs)
    assert rb.lengths.tolist() == [len(s) for s in case.seqs]
    for i, (seq, valid) in enumerate(zip(case.seqs, case.valid, strict=True)):
        values_TLK, valid_T = rb.sequence(i)
        assert np.array_equal(values_TLK.to(torch.int64).numpy(), seq)
        assert np.array_equal(valid_T.numpy(), valid)
    assert RouteBatch.from_sequences(
        [rb.sequence(i)[0] for i in range(rb.num_sequences)],
        case.meta,
        valid=[rb.sequence(i)[1] for i in range(rb.num_sequences)],
    ).equal(rb)


@SETTINGS
@given(cases(axis="all_layers"))
def test_round_trip_layer_axes_from_all_layers(case: Case) -> None:
    rb = _batch(case)
    moe = rb.to_layer_axis("moe_layers")
    assert moe.meta.layer_axis == "moe_layers"
    assert moe.meta.layer_numbers == case.meta.routed_layer_numbers
    moe.validate()
    back = moe.to_layer_axis("all_layers", num_layers=len(case.meta.layer_numbers))
    assert back.equal(rb)


@SETTINGS
@given(cases(axis="moe_layers"), st.integers(0, 3))
def test_round_trip_layer_axes_from_moe_layers(case: Case, extra: int) -> None:
    rb = _batch(case)
    num_layers = case.meta.layer_numbers[-1] + extra
    full = rb.to_layer_axis("all_layers", num_layers=num_layers)
    assert full.meta.layer_numbers == tuple(range(1, num_layers + 1))
    full.validate()
    dense = full.meta.dense_slots
    assert not full.values_NLK[:, list(dense)].any()
    assert full.to_layer_axis("moe_layers").equal(rb)


def test_to_layer_axis_needs_num_layers_from_moe_layers() -> None:
    rb = RouteBatch(
        _good()[:, 1:],
        [0, 5],
        None,
        RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(2, 4)),
    )
    with pytest.raises(LayoutError, match="needs num_layers"):
        rb.to_layer_axis("all_layers")
    with pytest.raises(LayoutError, match=r"num_layers=3 is smaller than layer 4"):
        rb.to_layer_axis("all_layers", num_layers=3)
    with pytest.raises(LayoutError, match="only to the all_layers"):
        rb.to_layer_axis("moe_layers", num_layers=4)
    assert rb.to_layer_axis("moe_layers") is rb
    full = rb.to_layer_axis("all_layers", num_layers=4)
    assert full.meta.moe_layer_numbers == (2, 4)
    assert torch.equal(full.values_NLK[:, [1, 3]], rb.values_NLK)


def test_from_padded_left_prompt_right_response() -> None:
    """The trainer layout: left-padded prompt then right-padded response in one row."""
    v = _good(6)
    padded = torch.zeros(2, 8, 3, 2, dtype=torch.int64)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, 2:6] = True  # 2 pad, 2 prompt + 2 response, 2 pad
    mask[1, 1:3] = True
    padded[mask] = v
    rb = RouteBatch.from_padded(padded, mask, _meta())
    assert rb.lengths.tolist() == [4, 2]
    assert torch.equal(rb.values_NLK.to(torch.int64), v)
    assert rb.valid_N.all()


def test_from_padded_rejects_valid_padding() -> None:
    padded, _ = RouteBatch(_good(), [0, 2, 5], None, _meta()).to_padded()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    with pytest.raises(RouteValidationError, match="sequence 0, position 2 is not a token"):
        RouteBatch.from_padded(padded, mask, _meta(), valid_BS=torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_from_nested_accepts_strided_nested_and_offset_views() -> None:
    rb = RouteBatch(_good(), [0, 2, 5], torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool), _meta())
    strided = torch.nested.nested_tensor([rb.sequence(0)[0], rb.sequence(1)[0]])
    valid = torch.nested.nested_tensor([rb.sequence(0)[1], rb.sequence(1)[1]])
    assert RouteBatch.from_nested(strided, _meta(), valid_nt=valid).equal(rb)
    offset = torch.nested.nested_tensor_from_jagged(rb.values_NLK, torch.tensor([2, 5]))
    tail = RouteBatch.from_nested(offset, _meta())
    assert torch.equal(tail.values_NLK, rb.values_NLK[2:])
    assert tail.offsets_B1.tolist() == [0, 3]


def test_sequence_views_share_storage_and_index_from_end() -> None:
    rb = RouteBatch(_good(), [0, 2, 5], None, _meta())
    values, valid = rb.sequence(-1)
    assert values.data_ptr() == rb.values_NLK[2:].data_ptr()
    assert valid.shape == (3,)
    with pytest.raises(IndexError):
        rb.sequence(2)
    assert rb.to("cpu").equal(rb)
    assert "B=2" in repr(rb)


def test_empty_batch_and_empty_sequences() -> None:
    empty = RouteBatch.from_sequences([], _meta())
    assert empty.num_sequences == 0
    assert empty.values_NLK.shape == (0, 3, 2)
    assert empty.to_padded()[0].shape == (0, 0, 3, 2)
    rb = RouteBatch.from_sequences([torch.zeros(0, 3, 2, dtype=torch.int32), _good(2)], _meta())
    assert rb.lengths.tolist() == [0, 2]
    assert RouteBatch.from_nested(rb.to_nested()[0], _meta()).equal(rb)


def test_equal_tells_meta_dtype_and_validity_apart() -> None:
    rb = RouteBatch(_good(), [0, 5], None, _meta())
    assert rb.equal(RouteBatch(_good(), [0, 5], None, _meta()))
    assert not rb.equal(RouteBatch(_good(), [0, 2, 5], None, _meta()))
    assert not rb.equal(RouteBatch(_good(), [0, 5], torch.tensor([1, 1, 1, 1, 0]).bool(), _meta()))
    assert not rb.equal(RouteBatch(_good(), [0, 5], None, _meta(E=300)))


# --- narrowing (E4) ---------------------------------------------------------------------------


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


# --- validation errors ------------------------------------------------------------------------


def _raises(match: str, values: torch.Tensor, offsets: list[int], **kw: object) -> None:
    valid = kw.pop("valid", None)
    meta = kw.pop("meta", _meta())
    with pytest.raises(RouteValidationError, match=match):
        RouteBatch(values, offsets, valid, meta, **kw)  # type: ignore[arg-type]


def test_valid_batch_passes() -> None:
    RouteBatch(_good(), [0, 2, 5], None, _meta()).validate()


def test_values_must_be_3d_integer() -> None:
    _raises(r"3-D \[N, L, K\]; got shape \(5, 6\)", _good().view(5, 6), [0, 5])
    _raises("integer dtype; got torch.float32", _good().float(), [0, 5])


def test_layer_count_and_top_k_must_match_meta() -> None:
    _raises(
        r"L=2 layer slots but meta\.layer_numbers has 3 on the all_layers axis",
        _good()[:, 1:],
        [0, 5],
    )
    _raises(r"K=1 ids per row; meta\.top_k=2", _good()[..., :1], [0, 5])


def test_offsets_and_valid_must_be_consistent() -> None:
    _raises("start at 0 and end at N=5", _good(), [1, 5])
    _raises("start at 0 and end at N=5", _good(), [0, 4])
    _raises(r"decrease at sequence 1: 3 -> 2", _good(), [0, 3, 2, 5])
    _raises(
        r"valid_N must be a bool tensor \[N=5\]; got shape \(4,\)",
        _good(),
        [0, 5],
        valid=torch.ones(4, dtype=torch.bool),
    )
    _raises("valid_N must be a bool mask", _good(), [0, 5], valid=torch.ones(5))


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
    v = _good()
    v[row, slot] = torch.tensor(ids)
    _raises(message, v, [0, 2, 5])


def test_out_of_range_int16_ids_name_sequence_row_and_layer() -> None:
    v16 = _good().to(torch.int16)
    v16[0, 1, 0] = -3
    _raises(r"sequence 0, token row 0 .* layer 2 .* \[-3, 2\]", v16, [0, 5], meta=_meta(E=300))


def test_out_of_range_ids_on_invalid_rows_are_ignored() -> None:
    v = _good()
    v[3, 2] = torch.tensor([9, 9])
    valid = torch.tensor([True, True, True, False, True])
    RouteBatch(v, [0, 2, 5], valid, _meta())


def test_nonzero_dense_slot_rejected() -> None:
    v = _good()
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
    v = _good()
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
    v = _good()
    v[2:, 2] = 0
    with pytest.raises(RouteValidationError, match="cannot be a real route"):
        RouteBatch(v, [0, 2, 5], None, _meta())
    with pytest.raises(RouteValidationError, match=r"expert ids \[0, 0\] repeat an id"):
        RouteBatch(v, [0, 2, 5], None, _meta(), allow_all_zero=True)


def test_E1_reported_before_duplicates_for_top_k_above_one() -> None:
    v = _good()
    v[:2, 1] = 0  # [0, 0] is also a repeated id
    _raises("sequence 0, layer 2 .* all zero", v, [0, 2, 5])


def test_E1_top_k_one_all_zero_slot_rejected() -> None:
    meta = RouteMeta(num_experts=4, top_k=1, layer_axis="moe_layers", layer_numbers=(5, 7))
    v = torch.tensor([[[1], [0]], [[2], [0]]])
    _raises(r"sequence 0, layer 7 \(slot 1\): expert ids are all zero", v, [0, 2], meta=meta)


def test_E1_ignores_invalid_rows_and_sequences_without_valid_rows() -> None:
    v = _good()
    v[2:, 2] = 0
    RouteBatch(v, [0, 2, 5], torch.tensor([1, 1, 0, 0, 0]).bool(), _meta())
    v[0, 2] = 0  # a zero row is fine while another valid row of the sequence routes
    v[0, 2, 1] = 0
    with pytest.raises(RouteValidationError, match="repeat an id"):
        RouteBatch(v, [0, 2, 5], torch.tensor([1, 1, 0, 0, 0]).bool(), _meta())


def test_validate_false_skips_id_checks_not_structure() -> None:
    v = _good()
    v[2:, 2] = 0
    rb = RouteBatch(v, [0, 2, 5], None, _meta(), validate=False)
    with pytest.raises(RouteValidationError, match="E1"):
        rb.validate()
    _raises("K=1", _good()[..., :1], [0, 5], validate=False)


def test_from_sequences_names_the_bad_sequence() -> None:
    with pytest.raises(
        RouteValidationError, match=r"sequence 1 has shape \(2, 2, 2\); expected \[T, 3, 2\]"
    ):
        RouteBatch.from_sequences([_good(2), _good(2)[:, 1:]], _meta())
    with pytest.raises(
        RouteValidationError, match=r"valid\[0\] has shape \(3,\); sequence 0 has 2"
    ):
        RouteBatch.from_sequences([_good(2)], _meta(), valid=[np.ones(3, dtype=bool)])
    with pytest.raises(RouteValidationError, match="1 masks for 2 sequences"):
        RouteBatch.from_sequences([_good(2), _good(2)], _meta(), valid=[np.ones(2, dtype=bool)])


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
    assert _meta().moe_slots == (1, 2)
    assert _meta().dense_slots == (0,)
    with pytest.raises(RouteValidationError, match="num_experts"):
        _meta(E=0)
    with pytest.raises(RouteValidationError, match=r"top_k must be an int in \[1, num_experts=8\]"):
        _meta(K=9)
    with pytest.raises(LayoutError, match="strictly increasing"):
        _meta(layers=(2, 1), moe=None)
    with pytest.raises(LayoutError, match="consecutive"):
        _meta(layers=(1, 3), moe=None)
    with pytest.raises(LayoutError, match="subset of layer_numbers"):
        _meta(moe=(4,))
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
    rb = RouteBatch(_good(), [0, 2, 5], None, _meta())
    with pytest.raises(RouteValidationError, match="length=2 is shorter than the longest sequence"):
        rb.to_padded(length=2)
    with pytest.raises(ValueError, match="padding_side"):
        rb.to_padded("middle")  # type: ignore[arg-type]


def test_validation_in_blocks_reports_global_rows_and_total_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rr_core.routes.validate_ids as validate_ids

    monkeypatch.setattr(validate_ids, "_BLOCK_IDS", 12)  # two rows per block
    RouteBatch(_good(7), [0, 2, 7], None, _meta())
    v = _good(7)
    v[3, 2, 1] = 9
    v[6, 1, 0] = 8
    _raises(r"sequence 1, token row 1 \(global row 3\).*2 row-layer pair\(s\)", v, [0, 2, 7])
    v = _good(7)
    v[2:, 2] = 0
    _raises(r"sequence 1, layer 3 \(slot 2\): expert ids are all zero on all 5", v, [0, 2, 7])


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


def test_slot_of_finds_a_layer_on_any_axis_and_names_the_axis_when_absent() -> None:
    every = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2, 3, 4))
    assert [every.slot_of(n) for n in (1, 2, 3, 4)] == [0, 1, 2, 3]
    stage = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(5, 7, 9))
    assert stage.slot_of(7) == 1  # not layer - 1: a stage's MoE layers
    with pytest.raises(LayoutError, match=r"layer 6 is not on this moe_layers axis.*\[5, 7, 9\]"):
        stage.slot_of(6)
    with pytest.raises(LayoutError, match="layer must be an int; got True"):
        stage.slot_of(True)
