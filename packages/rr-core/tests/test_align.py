"""R3 alignment: the T-1 contract (D1), prompt_start, truncation (D7) and SP padding (D5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core.errors import AlignmentError, RouteValidationError
from rr_core.replay.align import align_routes, pad_rows, replay_mask_for_lengths, truncate_routes
from rr_core.routes.batch import RouteBatch, RouteMeta
from rr_core.routes.rows import check_route_rows, expected_route_rows

SETTINGS = settings(max_examples=100, deadline=None)


def _rows(n: int, L: int = 2, K: int = 2) -> torch.Tensor:
    """Distinct, recognisable rows: row i holds ids i+1 .. (never the all-zero filler)."""
    return (torch.arange(n * L * K).view(n, L, K) % 250 + 1).to(torch.uint8)


def test_D1_t_minus_1_rows_accepted_last_row_invalid() -> None:
    routes, mask = align_routes(_rows(4), 5)
    assert routes.shape == (5, 2, 2)
    assert mask.tolist() == [True, True, True, True, False]
    assert torch.equal(routes[:4], _rows(4))
    assert not routes[4].any()


def test_D1_t_rows_accepted_all_valid() -> None:
    routes, mask = align_routes(_rows(5), 5)
    assert mask.all()
    assert torch.equal(routes, _rows(5))


@pytest.mark.parametrize("n", [3, 6])
def test_D1_t_minus_2_and_t_plus_1_rows_rejected(n: int) -> None:
    with pytest.raises(
        AlignmentError,
        match=rf"N={n} route rows for T=5 tokens with prompt_start=0; expected 4 or 5",
    ):
        align_routes(_rows(n), 5)


def test_D1_prompt_start_rows_invalid() -> None:
    routes, mask = align_routes(_rows(3), 6, prompt_start=2)  # T - prompt_start - 1 rows
    assert mask.tolist() == [False, False, True, True, True, False]
    assert torch.equal(routes[2:5], _rows(3))
    assert not routes[:2].any()
    assert not routes[5].any()
    with pytest.raises(AlignmentError, match=r"N=5 .* T=6 .* prompt_start=2; expected 3 \("):
        align_routes(_rows(5), 6, prompt_start=2)


def test_G4_one_row_more_from_a_prompt_start_is_refused() -> None:
    """T - prompt_start rows from prompt_start > 0 are the answer of a request sent with
    prompt_start - 1 (P - 1 for P on vLLM 0.22-0.29): read from prompt_start, every row would
    land one token late, so they are refused, as rr_vllm's decoders refuse them."""
    P, G = 4, 3
    answer = _rows(P + G - 1 - (P - 1))  # sent P - 1: the last prompt token's row comes too
    with pytest.raises(AlignmentError, match=r"sent with prompt_start=3.*G4"):
        align_routes(answer, P + G, prompt_start=P)
    routes, mask = align_routes(answer, P + G, prompt_start=P - 1)  # the start that was sent
    assert mask.tolist() == [False, False, False, True, True, True, False]
    assert torch.equal(routes[P - 1 : P + G - 1], answer)


@pytest.mark.parametrize(
    ("T", "start", "rows"), [(5, 0, 4), (6, 2, 3), (3, 3, 0), (1, 0, 0), (0, 0, 0), (7, 6, 0)]
)
def test_expected_route_rows_is_the_t_minus_1_rule(T: int, start: int, rows: int) -> None:
    assert expected_route_rows(T, prompt_start=start) == rows
    check_route_rows(rows, T, prompt_start=start)
    with pytest.raises(AlignmentError, match="D1"):
        check_route_rows(rows + 2, T, prompt_start=start)
    if 0 < start < T:  # one row more: G4
        with pytest.raises(AlignmentError, match="G4"):
            check_route_rows(rows + 1, T, prompt_start=start)
    else:  # a route for every token (start 0), or none left (start T)
        check_route_rows(T - start, T, prompt_start=start)


@pytest.mark.parametrize(("T", "start"), [(-1, 0), (3, 4), (3, -1)])
def test_expected_route_rows_bounds(T: int, start: int) -> None:
    with pytest.raises(AlignmentError, match=rf"num_tokens={T}, prompt_start={start}"):
        expected_route_rows(T, prompt_start=start)


def test_prompt_start_bounds() -> None:
    routes, mask = align_routes(_rows(0), 3, prompt_start=3)
    assert routes.shape == (3, 2, 2)
    assert not mask.any()
    with pytest.raises(AlignmentError, match=r"expected 0 \("):
        align_routes(_rows(1), 3, prompt_start=3)
    for bad in (-1, 4):
        with pytest.raises(AlignmentError, match=rf"prompt_start={bad}"):
            align_routes(_rows(2), 3, prompt_start=bad)
    with pytest.raises(AlignmentError, match="num_tokens=-1"):
        align_routes(_rows(0), -1)
    routes, mask = align_routes(_rows(0), 0)
    assert routes.shape == (0, 2, 2)


def test_align_accepts_read_only_numpy_and_keeps_dtype() -> None:
    arr = np.ones((2, 3, 4), dtype=np.uint16)  # vLLM >= 0.22 for more than 256 experts
    arr.setflags(write=False)
    routes, mask = align_routes(arr, 3)
    assert routes.shape == (3, 3, 4)
    assert routes.dtype == torch.int32  # uint16 widened exactly
    assert mask.tolist() == [True, True, False]
    with pytest.raises(RouteValidationError, match="3-D"):
        align_routes(np.ones((2, 3), dtype=np.int32), 3)


@SETTINGS
@given(st.integers(0, 20), st.integers(0, 20), st.booleans())
def test_D1_align_property(T: int, prompt_start: int, missing_last: bool) -> None:
    if prompt_start > T or (missing_last and prompt_start == T):
        return
    N = T - prompt_start - (1 if missing_last else 0)
    if not missing_last and 0 < prompt_start < T:  # one row more from a start: G4, refused
        with pytest.raises(AlignmentError, match="G4"):
            align_routes(_rows(N), T, prompt_start=prompt_start)
        return
    routes, mask = align_routes(_rows(N), T, prompt_start=prompt_start)
    assert int(mask.sum()) == N
    assert torch.equal(routes[mask], _rows(N))
    assert not routes[~mask].any()
    assert mask[prompt_start : prompt_start + N].all()


def test_D7_truncation_keeps_the_first_rows() -> None:
    routes, mask = align_routes(_rows(7), 8)
    short, short_mask = truncate_routes(routes, mask, 5)
    assert torch.equal(short, routes[:5])
    assert short_mask.tolist() == [True] * 5  # the truncated tokens were fed back: real routes
    assert truncate_routes(routes, mask, 0)[0].shape == (0, 2, 2)


def test_D7_truncation_never_extends() -> None:
    routes, mask = align_routes(_rows(4), 5)
    with pytest.raises(AlignmentError, match=r"cannot truncate 5 route rows to num_tokens=6"):
        truncate_routes(routes, mask, 6)
    with pytest.raises(AlignmentError, match="num_tokens=-1"):
        truncate_routes(routes, mask, -1)
    with pytest.raises(AlignmentError, match=r"mask_T must be bool \[T=5\]"):
        truncate_routes(routes, mask[:4], 3)


@SETTINGS
@given(st.integers(0, 30), st.integers(1, 8))
def test_D5_padding_does_not_shift_rows(T: int, multiple: int) -> None:
    routes, mask = align_routes(_rows(max(T - 1, 0)), T)
    padded, padded_mask = pad_rows(routes, mask, multiple)
    assert padded.shape[0] % multiple == 0
    assert T <= padded.shape[0] < T + multiple
    assert torch.equal(padded[:T], routes)
    assert torch.equal(padded_mask[:T], mask)
    assert not padded[T:].any()
    assert not padded_mask[T:].any()


def test_D5_padding_errors() -> None:
    routes, mask = align_routes(_rows(4), 5)
    with pytest.raises(AlignmentError, match="multiple must be >= 1; got 0"):
        pad_rows(routes, mask, 0)
    with pytest.raises(AlignmentError, match="mask_T"):
        pad_rows(routes, mask.int(), 4)


@SETTINGS
@given(st.lists(st.integers(0, 6), max_size=6), st.booleans())
def test_D1_replay_mask_for_lengths(lengths: list[int], missing_last: bool) -> None:
    expected = [not (missing_last and t == n - 1) for n in lengths for t in range(n)]
    assert replay_mask_for_lengths(lengths, missing_last=missing_last).tolist() == expected
    as_tensor = replay_mask_for_lengths(torch.tensor(lengths, dtype=torch.int32))
    assert as_tensor.tolist() == replay_mask_for_lengths(lengths).tolist()


def test_replay_mask_for_lengths_errors() -> None:
    with pytest.raises(AlignmentError, match=r">= 0; got \[2, -1\]"):
        replay_mask_for_lengths([2, -1])
    with pytest.raises(AlignmentError, match="1-D integer"):
        replay_mask_for_lengths(torch.tensor([1.0]))
    with pytest.raises(AlignmentError, match="1-D integer"):
        replay_mask_for_lengths([2.5])  # type: ignore[list-item]


def test_D1_aligned_sequences_batch_matches_replay_mask() -> None:
    """Engine rows for three sequences, aligned and batched: exactly the last rows stay native."""
    meta = RouteMeta(num_experts=256, top_k=2, layer_axis="moe_layers", layer_numbers=(1, 2))
    aligned = [align_routes(_rows(T - 1), T) for T in (3, 1, 5)]
    rb = RouteBatch.from_sequences([r for r, _ in aligned], meta, valid=[m for _, m in aligned])
    assert torch.equal(rb.valid_N, replay_mask_for_lengths(rb.lengths))


_NOT_INTS = [None, 2.0, "3", [1], np.array([[1]]), torch.tensor(1.5), True, b""]


@pytest.mark.parametrize("bad", _NOT_INTS)
def test_counts_must_be_ints(bad: object) -> None:
    routes = torch.zeros(3, 2, 2, dtype=torch.uint8)
    mask = torch.ones(3, dtype=torch.bool)
    calls = {
        "num_tokens": lambda: align_routes(routes, bad),  # type: ignore[arg-type]
        "prompt_start": lambda: align_routes(routes, 4, prompt_start=bad),  # type: ignore[arg-type]
        "num_tokens ": lambda: truncate_routes(routes, mask, bad),  # type: ignore[arg-type]
        "multiple": lambda: pad_rows(routes, mask, bad),  # type: ignore[arg-type]
    }
    for name, call in calls.items():
        with pytest.raises(AlignmentError, match=f"{name.strip()} must be an int; got"):
            call()


@pytest.mark.parametrize("bad", [None, [True, True, True], np.ones(3, bool), 3])
def test_truncate_and_pad_take_tensors(bad: object) -> None:
    routes = torch.zeros(3, 2, 2, dtype=torch.uint8)
    with pytest.raises(AlignmentError, match=r"mask_T must be a torch.Tensor"):
        truncate_routes(routes, bad, 2)  # type: ignore[arg-type]
    with pytest.raises(AlignmentError, match=r"routes_TLK must be a torch.Tensor"):
        pad_rows(bad, torch.ones(3, dtype=torch.bool), 2)  # type: ignore[arg-type]
    with pytest.raises(AlignmentError, match=r"routes_TLK must be 3-D \[T, L, K\]"):
        pad_rows(routes[:, 0], torch.ones(3, dtype=torch.bool), 2)


@pytest.mark.parametrize("bad", [None, 3, "34", b"3", [1.5, 2], [[1, 2]], ["a"], {1: 2}])
def test_lengths_must_be_a_1d_integer_sequence(bad: object) -> None:
    with pytest.raises(AlignmentError, match="lengths must be a 1-D integer sequence"):
        replay_mask_for_lengths(bad)  # type: ignore[arg-type]


def test_lengths_from_numpy_and_numpy_ints() -> None:
    expected = torch.tensor([True, False, True, True, False])
    assert torch.equal(replay_mask_for_lengths(np.array([2, 3])), expected)
    assert torch.equal(replay_mask_for_lengths([np.int64(2), 3]), expected)
