"""rr_core.checks, the argument checks every package uses: each raises the caller's error class
with what was expected and what came, and takes nothing that merely looks right."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rr_core import AlignmentError, RouteMeta
from rr_core.checks import check_instance, check_sequence


@pytest.mark.parametrize(
    "value",
    ["ab", b"ab", {"a": 1}, torch.tensor([1, 2]), np.array([1, 2]), 3, None],
    ids=["str", "bytes", "mapping", "tensor", "array", "int", "None"],
)
def test_a_sequence_is_a_list_or_tuple_not_what_iterates_like_one(value: Any) -> None:
    with pytest.raises(AlignmentError, match="indices must be a list; got"):
        check_sequence(value, "indices", AlignmentError)


def test_sequence_items_are_checked_and_the_first_wrong_one_named() -> None:
    assert check_sequence((1, None), "xs", AlignmentError, of=(int, type(None))) == [1, None]
    with pytest.raises(AlignmentError, match=r"xs\[1\] must be int or None; got 'a' \(str\)"):
        check_sequence([1, "a"], "xs", AlignmentError, of=(int, type(None)))


def test_an_instance_check_says_what_was_taken_what_came_and_how_to_get_one() -> None:
    meta = RouteMeta(num_experts=4, top_k=2, layer_axis="moe_layers", layer_numbers=(1,))
    assert check_instance(meta, RouteMeta, AlignmentError, "f takes a RouteMeta") is meta
    with pytest.raises(AlignmentError) as info:
        check_instance(torch.zeros(2, 3), RouteMeta, AlignmentError, "f takes a RouteMeta", "!")
    assert str(info.value) == "f takes a RouteMeta; got a torch.float32 tensor of shape (2, 3)!"


def test_a_bool_tensor_is_no_index_and_a_top_k_takes_only_matching_values() -> None:
    """Found by the junk sweep: ``k=torch.tensor(True)`` reached torch.topk (an internal
    assertion there) and ``values_TE=-1`` an AttributeError."""
    from rr_core import ReplayError, native_topk, replay_topk
    from rr_core.checks import as_index

    with pytest.raises(AlignmentError, match="k must be an int"):
        as_index(torch.tensor(True), "k", AlignmentError)
    assert as_index(torch.tensor(3), "k", AlignmentError) == 3
    scores = torch.rand(4, 6)
    with pytest.raises(ReplayError, match="k must be an int"):
        native_topk(scores, torch.tensor(True))  # type: ignore[arg-type]
    for values in (-1, torch.rand(4, 5)):
        with pytest.raises(ReplayError, match="values_TE must be a tensor shaped like"):
            native_topk(scores, 2, values_TE=values)  # type: ignore[arg-type]
        with pytest.raises(ReplayError, match="values_TE must be a tensor shaped like"):
            replay_topk(scores, 2, target_ids_TK=scores.topk(2).indices, values_TE=values)  # type: ignore[arg-type]
