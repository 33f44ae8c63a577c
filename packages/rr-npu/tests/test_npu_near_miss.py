"""Near-miss sweeps over rr_npu's torch-only entry points: a backend name in another
spelling plans as the backend or is named; ids in another dtype go over the wire as the same
ids or are named."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rr_fakes.sweeps import SWEEP, right_or_named, spellings, widened
from rr_npu import ids_for_gather, wire_plan

IDS = torch.tensor([[0, 5], [7, 3]], dtype=torch.uint8)


@SWEEP
@given(
    backend=st.sampled_from(["hccl", "nccl", "gloo"]).flatmap(spellings),
    dtype=st.sampled_from([torch.uint8, torch.int16, torch.bool]),
)
def test_a_backend_in_another_spelling_plans_as_it_or_is_named(
    backend: str, dtype: torch.dtype
) -> None:
    canonical = backend.strip().lower()
    if canonical not in ("hccl", "nccl", "gloo"):
        canonical = "hccl"
    right_or_named(
        lambda: wire_plan(dtype, backend),
        "backend",
        right=lambda plan: plan == wire_plan(dtype, canonical),
    )


@SWEEP
@given(data=st.data())
def test_ids_in_another_dtype_go_over_the_wire_as_the_same_ids_or_are_named(
    data: st.DataObject,
) -> None:
    ids = data.draw(widened(IDS))
    right_or_named(
        lambda: ids_for_gather(ids),
        "ids",
        "dtype",
        right=lambda out: torch.equal(torch.as_tensor(out).long().reshape(IDS.shape), IDS.long()),
    )
