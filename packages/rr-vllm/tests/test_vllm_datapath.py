"""The data path of decode_vllm_batch: completions placed on several threads give the batch and
the first error (in completion order) that one thread gives; ``validate=False`` skips only
rr_core's id checks; the decoders' row-count check is rr_core's, the one align_routes runs."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import AlignmentError, RouteMeta, RouteValidationError, align_routes
from rr_fakes.emulations.engines import Faults, VllmEra, vllm_request_output
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    SampleRoutes,
    decode_routes_array,
    decode_vllm_output,
    validate_samples,
)
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
    return validate_samples(
        [s for o in outs for s in decode_vllm_output(o, DecodeOptions(meta=meta))], meta, **kw
    )


def test_threads_place_every_completion(threads: int) -> None:
    meta = make_meta(16, dense=(1,))
    outs = outputs(meta, 13)
    batch = decode_vllm_output(outs, DecodeOptions(meta=meta)).to_batch()
    assert batch.equal(reference(outs, meta))
    assert batch.equal(
        decode_vllm_output(outs, DecodeOptions(meta=meta, validate=False)).to_batch()
    )


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
        decode_vllm_output(outs, DecodeOptions(meta=meta, logical_experts=8)).to_batch()
    assert str(got.value) == str(want.value)
    assert isinstance(got.value, EngineOutputError if first < second else RouteValidationError)


@pytest.mark.parametrize("fault", [Faults(all_zero=True), Faults(physical_map=np.arange(8) + 5)])
def test_validate_false_skips_the_id_checks_only(fault: Faults) -> None:
    """The batch comes back unchecked, and its own validate() raises what validating would."""
    meta = make_meta(8)
    outs = outputs(meta, 4, {1: fault})
    with pytest.raises(RouteValidationError) as want:
        decode_vllm_output(outs, DecodeOptions(meta=meta)).to_batch()
    unchecked = decode_vllm_output(outs, DecodeOptions(meta=meta, validate=False)).to_batch()
    with pytest.raises(RouteValidationError) as got:
        unchecked.validate()
    assert str(got.value) == str(want.value)


def test_validate_false_still_checks_structure() -> None:
    meta = make_meta(8)
    missing = outputs(meta, 3, {2: Faults(missing=True)})
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_output(missing, DecodeOptions(meta=meta, validate=False)).to_batch()
    physical = outputs(meta, 3, {0: Faults(physical_map=np.arange(8)[::-1] + 2)})
    with pytest.raises(RouteValidationError, match="E2"):
        decode_vllm_output(
            physical, DecodeOptions(meta=meta, validate=False, logical_experts=8)
        ).to_batch()


def _decode_one(
    rows: np.ndarray, meta: RouteMeta, p: int, g: int, prompt_start: int
) -> SampleRoutes | None:
    options = DecodeOptions(meta=meta, prompt_start=prompt_start)
    return decode_routes_array(
        rows, options, num_prompt_tokens=p, num_generated_tokens=g, finish_reason="stop"
    ).only()


def test_decoders_accept_the_rows_align_routes_accepts_and_refuse_a_g4_shift() -> None:
    """One row rule (rr_core's check_route_rows) on both sides: a decoded array is accepted
    exactly when align_routes accepts it, and T - prompt_start rows from prompt_start > 0 (a
    request sent with P - 1, G4, decoded with P) are refused by both, never read one row late."""
    meta = RouteMeta(num_experts=4, top_k=1, layer_axis="all_layers", layer_numbers=(1,))
    for p in range(5):
        for g in range(3):
            t = p + g
            for prompt_start in range(-1, p + 2):
                for num_rows in range(t + 2):
                    rows = np.zeros((num_rows, 1, 1), dtype=np.uint8)
                    try:
                        align_routes(torch.from_numpy(rows), t, prompt_start=prompt_start)
                        accepted = True
                    except AlignmentError:
                        accepted = False
                    shifted = 0 < prompt_start < t and num_rows == t - prompt_start
                    decode = functools.partial(_decode_one, rows, meta, p, g, prompt_start)
                    if prompt_start < 0:
                        with pytest.raises(EngineOutputError, match="prompt_start"):
                            decode()
                    elif accepted:
                        assert not shifted
                        sample = decode()
                        assert sample is not None
                        assert int(sample.valid_T.sum()) == num_rows
                    else:
                        with pytest.raises(AlignmentError, match="G4" if shifted else "D1|num_tok"):
                            decode()
