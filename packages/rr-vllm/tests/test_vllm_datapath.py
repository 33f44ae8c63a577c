"""The data path of decode_vllm_batch: completions placed on several threads give the batch and
the first error (in completion order) that one thread gives; ``validate=False`` skips only
rr_core's id checks; the row-count check refuses exactly what rr_core's align_routes refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import AlignmentError, RouteMeta, RouteValidationError, align_routes
from rr_fakes.engines import Faults, VllmEra, vllm_request_output
from rr_vllm import EngineOutputError, decode_vllm_batch, decode_vllm_output, validate_samples
from rr_vllm._validate import check_row_count
from vllm_testing import distinct_routes, make_meta


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def outputs(meta: RouteMeta, n: int, faults: dict[int, Faults] | None = None) -> list[Any]:
    out = []
    for i in range(n):
        p, g = 3 + i % 5, 2 + i % 7
        out.append(
            vllm_request_output(
                VllmEra.V0_32,
                prompt_ids=list(range(p)),
                generated_ids=list(range(g)),
                routes_TLK=distinct_routes(meta, p + g - 1, seed=i),
                num_experts=meta.num_experts,
                moe_layer_numbers=meta.moe_layer_numbers,
                request_id=str(i),
                faults=(faults or {}).get(i, Faults()),
                use_real_vllm=False,
            )
        )
    return out


def reference(outs: list[Any], meta: RouteMeta, **kw: Any) -> Any:
    return validate_samples([s for o in outs for s in decode_vllm_output(o, meta)], meta, **kw)


def test_threads_place_every_completion(threads: int) -> None:
    meta = make_meta(16, dense=(1,))
    outs = outputs(meta, 13)
    batch = decode_vllm_batch(outs, meta)
    assert batch.equal(reference(outs, meta))
    assert batch.equal(decode_vllm_batch(outs, meta, validate=False))


@pytest.mark.parametrize(
    ("first", "second"),
    [(2, 11), (11, 2), (0, 12)],  # the failing completions in either thread's range
)
def test_the_first_failing_completion_is_reported(threads: int, first: int, second: int) -> None:
    """Completion ``min(first, second)`` raises: missing routes (D3) there, physical ids (E2)
    at the other; whichever thread reaches its fault first."""
    meta = make_meta(8)
    faults = {first: Faults(missing=True), second: Faults(physical_map=np.arange(8)[::-1] + 2)}
    outs = outputs(meta, 13, faults)
    with pytest.raises((EngineOutputError, RouteValidationError)) as want:
        reference(outs, meta, logical_experts=8)
    with pytest.raises(type(want.value)) as got:
        decode_vllm_batch(outs, meta, logical_experts=8)
    assert str(got.value) == str(want.value)
    assert isinstance(got.value, EngineOutputError if first < second else RouteValidationError)


@pytest.mark.parametrize("fault", [Faults(all_zero=True), Faults(physical_map=np.arange(8) + 5)])
def test_validate_false_skips_the_id_checks_only(fault: Faults) -> None:
    """The batch comes back unchecked, and its own validate() raises what validating would."""
    meta = make_meta(8)
    outs = outputs(meta, 4, {1: fault})
    with pytest.raises(RouteValidationError) as want:
        decode_vllm_batch(outs, meta)
    unchecked = decode_vllm_batch(outs, meta, validate=False)
    with pytest.raises(RouteValidationError) as got:
        unchecked.validate()
    assert str(got.value) == str(want.value)


def test_validate_false_still_checks_structure() -> None:
    meta = make_meta(8)
    missing = outputs(meta, 3, {2: Faults(missing=True)})
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_batch(missing, meta, validate=False)
    physical = outputs(meta, 3, {0: Faults(physical_map=np.arange(8)[::-1] + 2)})
    with pytest.raises(RouteValidationError, match="E2"):
        decode_vllm_batch(physical, meta, validate=False, logical_experts=8)


def test_row_count_check_refuses_what_align_routes_refuses_and_a_g4_shift() -> None:
    """align_routes' counts, but for T - prompt_start rows from prompt_start > 0: that is a
    request sent with P - 1 (G4) decoded with P, which would shift every row by one."""
    for num_tokens in range(5):
        for prompt_start in range(-1, 7):
            for num_rows in range(7):
                try:
                    align_routes(
                        torch.empty((num_rows, 0, 0), dtype=torch.int8),
                        num_tokens,
                        prompt_start=prompt_start,
                    )
                    accepted = True
                except AlignmentError:
                    accepted = False
                shifted = 0 < prompt_start < num_tokens and num_rows == num_tokens - prompt_start
                if accepted and not shifted:
                    check_row_count(num_rows, num_tokens, prompt_start)
                else:
                    with pytest.raises(AlignmentError, match="G4" if shifted else ""):
                        check_row_count(num_rows, num_tokens, prompt_start)
