"""The route payload policy over HCCL, NCCL and gloo.

Real-world failures guarded against: int16 ``all_gather`` rejected by gloo ("Invalid scalar
type") and absent from NCCL; uint16/32/64 rejected by HCCL; routes widened to int64 before the
wire (4x the bytes: the 45 GB routes broadcast that timed out on an NPU cluster, F2).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rr_npu


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int8, torch.bool])
def test_every_wire_dtype_is_accepted_by_its_backend(dtype: torch.dtype) -> None:
    from rr_fakes import check_hccl_dtype

    hccl = rr_npu.wire_plan(dtype, "hccl")
    check_hccl_dtype(getattr(torch, hccl.wire_dtype))  # raises as HCCL does
    # HCCL takes every narrow integer as it is; only bool (no HCCL collective) goes as bytes.
    assert hccl.byte_view is (dtype is torch.bool)
    assert hccl.wire_dtype == (
        "uint8" if dtype is torch.bool else str(dtype).removeprefix("torch.")
    )
    for backend in ("nccl", "gloo"):
        assert rr_npu.wire_plan(dtype, backend).wire_dtype == "uint8"
    if dtype is torch.int16:
        assert (hccl.wire_dtype, hccl.byte_view) == ("int16", False)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_wide_payloads_are_refused(dtype: torch.dtype) -> None:
    with pytest.raises(rr_npu.PayloadPolicyError, match="ids_for_gather"):
        rr_npu.wire_plan(dtype, "hccl")


def test_ids_are_widened_only_for_gather() -> None:
    ids = torch.tensor([[3, 1]], dtype=torch.int16)
    scores = torch.arange(8.0).reshape(1, 8)
    assert torch.equal(scores.gather(-1, rr_npu.ids_for_gather(ids)), torch.tensor([[3.0, 1.0]]))


def _gather_on_rank() -> dict[str, Any]:
    import torch.distributed as dist

    from rr_npu._collectives import group_backend

    rank = dist.get_rank()
    ids_TLK = (torch.arange(24, dtype=torch.int16).reshape(4, 3, 2) * 97 + rank * 1000) % 30000
    raw_error = ""
    try:
        dist.all_gather([torch.empty_like(ids_TLK) for _ in range(2)], ids_TLK)
    except Exception as error:  # gloo on torch 2.13 rejects int16 all_gather
        raw_error = f"{type(error).__name__}: {error}"
    parts = rr_npu.all_gather_routes(ids_TLK)
    return {
        "backend": group_backend(),
        "raw_error": raw_error,
        "dtypes": [str(p.dtype) for p in parts],
        "parts": [p.tolist() for p in parts],
        "mine": ids_TLK.tolist(),
    }


def test_two_process_gloo_gather_is_exact_as_uint8_views() -> None:
    from rr_fakes.shims.megatron import launch

    results = launch(_gather_on_rank, 2)
    for rank, result in enumerate(results):
        assert result["backend"] == "gloo"
        assert result["raw_error"], "gloo accepted int16; the byte view is still the policy"
        assert result["dtypes"] == ["torch.int16", "torch.int16"]
        assert result["parts"] == [results[0]["mine"], results[1]["mine"]], rank
