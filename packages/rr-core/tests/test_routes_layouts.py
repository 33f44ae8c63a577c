"""Route batches in every layout: round trips through padded, nested and per-sequence form and
across the layer axes, sequence views, equality, and a layer's slot on an axis."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.axis import LayerAxis
from rr_core.routes.batch import RouteBatch, RouteMeta

from rr_core_testing import EXPERT_COUNTS, good_route_rows, route_meta

LAYER_AXES_: tuple[LayerAxis, ...] = ("all_layers", "moe_layers")
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
        good_route_rows()[:, 1:],
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
    v = good_route_rows(6)
    padded = torch.zeros(2, 8, 3, 2, dtype=torch.int64)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, 2:6] = True  # 2 pad, 2 prompt + 2 response, 2 pad
    mask[1, 1:3] = True
    padded[mask] = v
    rb = RouteBatch.from_padded(padded, mask, route_meta())
    assert rb.lengths.tolist() == [4, 2]
    assert torch.equal(rb.values_NLK.to(torch.int64), v)
    assert rb.valid_N.all()


def test_from_padded_rejects_valid_padding() -> None:
    padded, _ = RouteBatch(good_route_rows(), [0, 2, 5], None, route_meta()).to_padded()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    with pytest.raises(RouteValidationError, match="sequence 0, position 2 is not a token"):
        RouteBatch.from_padded(
            padded, mask, route_meta(), valid_BS=torch.ones(2, 3, dtype=torch.bool)
        )


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_from_nested_accepts_strided_nested_and_offset_views() -> None:
    rb = RouteBatch(
        good_route_rows(), [0, 2, 5], torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool), route_meta()
    )
    strided = torch.nested.nested_tensor([rb.sequence(0)[0], rb.sequence(1)[0]])
    valid = torch.nested.nested_tensor([rb.sequence(0)[1], rb.sequence(1)[1]])
    assert RouteBatch.from_nested(strided, route_meta(), valid_nt=valid).equal(rb)
    offset = torch.nested.nested_tensor_from_jagged(rb.values_NLK, torch.tensor([2, 5]))
    tail = RouteBatch.from_nested(offset, route_meta())
    assert torch.equal(tail.values_NLK, rb.values_NLK[2:])
    assert tail.offsets_B1.tolist() == [0, 3]


def test_sequence_views_share_storage_and_index_from_end() -> None:
    rb = RouteBatch(good_route_rows(), [0, 2, 5], None, route_meta())
    values, valid = rb.sequence(-1)
    assert values.data_ptr() == rb.values_NLK[2:].data_ptr()
    assert valid.shape == (3,)
    with pytest.raises(IndexError):
        rb.sequence(2)
    assert rb.to("cpu").equal(rb)
    assert "B=2" in repr(rb)


def test_empty_batch_and_empty_sequences() -> None:
    empty = RouteBatch.from_sequences([], route_meta())
    assert empty.num_sequences == 0
    assert empty.values_NLK.shape == (0, 3, 2)
    assert empty.to_padded()[0].shape == (0, 0, 3, 2)
    rb = RouteBatch.from_sequences(
        [torch.zeros(0, 3, 2, dtype=torch.int32), good_route_rows(2)], route_meta()
    )
    assert rb.lengths.tolist() == [0, 2]
    assert RouteBatch.from_nested(rb.to_nested()[0], route_meta()).equal(rb)


def test_equal_tells_meta_dtype_and_validity_apart() -> None:
    rb = RouteBatch(good_route_rows(), [0, 5], None, route_meta())
    assert rb.equal(RouteBatch(good_route_rows(), [0, 5], None, route_meta()))
    assert not rb.equal(RouteBatch(good_route_rows(), [0, 2, 5], None, route_meta()))
    assert not rb.equal(
        RouteBatch(good_route_rows(), [0, 5], torch.tensor([1, 1, 1, 1, 0]).bool(), route_meta())
    )
    assert not rb.equal(RouteBatch(good_route_rows(), [0, 5], None, route_meta(E=300)))


def test_slot_of_finds_a_layer_on_any_axis_and_names_the_axis_when_absent() -> None:
    every = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2, 3, 4))
    assert [every.slot_of(n) for n in (1, 2, 3, 4)] == [0, 1, 2, 3]
    stage = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(5, 7, 9))
    assert stage.slot_of(7) == 1  # not layer - 1: a stage's MoE layers
    with pytest.raises(LayoutError, match=r"layer 6 is not on this moe_layers axis.*\[5, 7, 9\]"):
        stage.slot_of(6)
    with pytest.raises(LayoutError, match="layer must be an int; got True"):
        stage.slot_of(True)
