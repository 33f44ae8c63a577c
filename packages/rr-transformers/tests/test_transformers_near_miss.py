"""Near-miss sweeps over rr_transformers' layout entry points: an attention mask in
another dtype (bool, float, int64, as tokenizers and collates leave it) gives the routes of the
bool mask or an RRError naming it; the arguments swapped are named."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rr_core import RouteBatch, RouteMeta
from rr_fakes import distinct_ids
from rr_fakes.sweeps import SWEEP, right_or_named, widened
from rr_transformers import routes_for_padded

META = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2))
BATCH = RouteBatch(distinct_ids(7, 2, num_experts=8, top_k=2, seed=4), [0, 3, 7], None, META)
MASK = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.int64)  # left padding
ROUTES, REPLAY = routes_for_padded(BATCH, MASK)


@SWEEP
@given(data=st.data())
def test_an_attention_mask_in_another_dtype_lays_out_alike_or_is_named(
    data: st.DataObject,
) -> None:
    mask = data.draw(widened(MASK) | st.just(MASK.bool()))
    right_or_named(
        lambda: routes_for_padded(BATCH, mask),
        "attention_mask",
        right=lambda out: torch.equal(out[0], ROUTES) and torch.equal(out[1], REPLAY),
    )


def test_the_arguments_swapped_are_named() -> None:
    right_or_named(lambda: routes_for_padded(MASK, BATCH), "batch", "routebatch")  # type: ignore[arg-type]
