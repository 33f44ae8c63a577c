"""Near-miss sweeps over rr_megatron_compat's layout entry points: moe_layer_freq as
the JSON text of its list, or as a list of bools or floats, reads as the list or is named; a
layer count just past the list's length is named; sp_pad's routes in another dtype pad alike
or are named."""

from __future__ import annotations

import json

import torch
from hypothesis import given
from hypothesis import strategies as st

from rr_fakes import distinct_ids
from rr_fakes.sweeps import SWEEP, just_past, right_or_named, widened
from rr_megatron_compat import parse_moe_layer_freq, sp_pad

FREQ = [1, 0, 1, 1, 0, 1]


@SWEEP
@given(
    freq=st.sampled_from(
        [
            json.dumps(FREQ),
            f" {json.dumps(FREQ)}\n",
            [bool(f) for f in FREQ],
            [float(f) for f in FREQ],
        ]
    )
)
def test_moe_layer_freq_in_another_form_reads_as_the_list_or_is_named(freq: object) -> None:
    right_or_named(
        lambda: parse_moe_layer_freq(freq, len(FREQ)),
        "moe_layer_freq",
        right=lambda out: tuple(out) == tuple(FREQ),  # type: ignore[arg-type]
    )


@SWEEP
@given(layers=just_past(len(FREQ)))
def test_a_layer_count_past_the_list_is_named(layers: int) -> None:
    right_or_named(lambda: parse_moe_layer_freq(FREQ, layers), "moe_layer_freq", "layers")


ROUTES = distinct_ids(5, 2, num_experts=8, top_k=2, seed=6).to(torch.uint8)
MASK = torch.tensor([True, True, False, True, True])
PADDED, PADDED_MASK = sp_pad(ROUTES, MASK, 2)


@SWEEP
@given(data=st.data())
def test_sp_pad_of_ids_in_another_dtype_pads_alike_or_is_named(data: st.DataObject) -> None:
    routes = data.draw(widened(ROUTES))
    right_or_named(
        lambda: sp_pad(routes, MASK, 2),
        "routes",
        "dtype",
        right=lambda out: (
            torch.equal(out[0].long(), PADDED.long()) and torch.equal(out[1], PADDED_MASK)
        ),
    )
