"""G4: ``routed_experts_prompt_start == P`` kills the EngineCore of vLLM 0.22-0.29 (#55750).

rr sends ``P - 1`` there; the decode of what was sent, with the extra row dropped, must equal
what a fixed release (0.30+) returns for ``P``, row for row.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rr_core import AlignmentError
from rr_fakes.emulations.engines import EngineDeadError, vllm_request_output
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    decode_vllm_output,
    drop_rows_before,
    prompt_start_to_send,
    vllm_flags,
    vllm_sampling_fields,
)
from vllm_testing import META, distinct_routes

CRASHING = ["0.22.0", "0.22.1", "0.25.1", "0.27.1", "0.28.0", "0.29.0"]
FIXED = ["0.30.0", "0.31.0", "0.32.0", "0.33.0"]


def _fields(p: int, start: int, version: str) -> dict[str, int]:
    return vllm_sampling_fields(
        p,
        prompt_length=64,
        response_length=8,
        max_model_len=128,
        prompt_start=start,
        vllm_version=version,
    )


@pytest.mark.parametrize("version", CRASHING + FIXED)
def test_whole_prompt_flag_comes_from_the_wheels(version: str) -> None:
    # 0.22.0-0.29.0 assert prompt_start < P in the scheduler; 0.30.0 has <= (vLLM PR #56844)
    assert vllm_flags(version).prompt_start_whole_prompt is (version in FIXED)


@pytest.mark.parametrize("version", CRASHING)
def test_whole_prompt_is_sent_as_p_minus_1_where_the_engine_dies(version: str) -> None:
    assert _fields(5, 5, version)["routed_experts_prompt_start"] == 4
    for start in range(5):  # every other start goes out as asked
        assert _fields(5, start, version)["routed_experts_prompt_start"] == start


@pytest.mark.parametrize("version", FIXED)
def test_whole_prompt_is_sent_as_is_where_it_is_served(version: str) -> None:
    assert _fields(5, 5, version)["routed_experts_prompt_start"] == 5


@pytest.mark.parametrize("version", ["0.14.0", "0.21.0"])
def test_no_knob_no_field(version: str) -> None:
    assert "routed_experts_prompt_start" not in _fields(5, 0, version)
    with pytest.raises(CaptureError, match=r"arrived in 0\.22"):
        prompt_start_to_send(5, 5, vllm_flags(version))


@pytest.mark.parametrize("start", [-1, 6, True, 2.0])
def test_starts_outside_the_prompt_are_refused(start: object) -> None:
    with pytest.raises(CaptureError, match="prompt_start"):
        prompt_start_to_send(start, 5, vllm_flags("0.28.0"))  # type: ignore[arg-type]


def test_the_emulated_engine_dies_on_p_before_0_30() -> None:
    routes = distinct_routes(META, 5 + 3 - 1)
    kwargs = {"prompt_ids": range(5), "generated_ids": [7, 8, 9], "routes_TLK": routes}
    with pytest.raises(EngineDeadError, match="EngineCore died"):
        vllm_request_output(
            "0.22-0.31", num_experts=8, prompt_start=5, engine_version="0.28.0", **kwargs
        )
    out = vllm_request_output(
        "0.22-0.31", num_experts=8, prompt_start=5, engine_version="0.30.0", **kwargs
    )
    assert out.outputs[0].routed_experts.shape[0] == 2


def _answer(era: str, p: int, g: int, routes: np.ndarray, sent: int, version: str) -> object:
    """vLLM ``version``'s answer to ``p`` prompt tokens (ids from 0) and ``g`` generated ones
    (from 100), routed as ``routes``, to a request sent with ``prompt_start=sent``."""
    return vllm_request_output(
        era,
        prompt_ids=range(p),
        generated_ids=range(100, 100 + g),
        routes_TLK=routes,
        num_experts=8,
        prompt_start=sent,
        engine_version=version,
    )


def _guarded(p: int, g: int, start: int, version: str, seed: int) -> tuple[object, np.ndarray]:
    era = "0.32+" if vllm_flags(version).aux_output_store else "0.22-0.31"
    routes = distinct_routes(META, p + g - 1, seed=seed)
    sent = _fields(p, start, version)["routed_experts_prompt_start"]
    out = _answer(era, p, g, routes, sent, version)
    (sample,) = decode_vllm_output(out, DecodeOptions(meta=META, prompt_start=sent))
    assert sample is not None
    return drop_rows_before(sample, start), routes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.integers(1, 12),
    g=st.integers(1, 6),
    data=st.data(),
    version=st.sampled_from(CRASHING + FIXED),
    seed=st.integers(0, 2**16),
)
def test_guarded_decode_is_what_a_fixed_engine_returns(
    p: int, g: int, data: st.DataObject, version: str, seed: int
) -> None:
    start = data.draw(st.sampled_from([p, 0, p // 2]))
    sample, routes = _guarded(p, g, start, version, seed)
    reference, _ = _guarded(p, g, start, "0.30.0", seed)
    t = p + g
    assert sample.routes_TLK.shape[0] == t
    expected_valid = (np.arange(t) >= start) & (np.arange(t) < t - 1)
    np.testing.assert_array_equal(sample.valid_T, expected_valid)
    np.testing.assert_array_equal(sample.routes_TLK[start : t - 1], routes[start:])
    assert not sample.routes_TLK[~sample.valid_T].any()
    np.testing.assert_array_equal(sample.routes_TLK, reference.routes_TLK)
    np.testing.assert_array_equal(sample.valid_T, reference.valid_T)


def test_the_guard_row_is_the_last_prompt_tokens_route() -> None:
    # kept (not dropped) it is an exact route: vLLM always recomputes the last prompt token
    p, g = 6, 3
    routes = distinct_routes(META, p + g - 1, seed=3)
    out = vllm_request_output(
        "0.22-0.31",
        prompt_ids=range(p),
        generated_ids=[1, 2, 3],
        routes_TLK=routes,
        num_experts=8,
        prompt_start=p - 1,
        engine_version="0.28.0",
    )
    (sample,) = decode_vllm_output(out, DecodeOptions(meta=META, prompt_start=p - 1))
    assert sample is not None
    assert sample.valid_T[p - 1]
    assert not sample.valid_T[: p - 1].any()
    np.testing.assert_array_equal(sample.routes_TLK[p - 1], routes[p - 1])


def test_drop_rows_before_copies_only_when_rows_change() -> None:
    sample, _ = _guarded(5, 3, 5, "0.33.0", 0)
    assert drop_rows_before(sample, 5) is sample
    assert drop_rows_before(sample, 2) is sample
    with pytest.raises(CaptureError, match="past the prompt"):
        drop_rows_before(sample, 6)


@pytest.mark.parametrize("version", CRASHING)
def test_decoding_the_sent_p_minus_1_answer_with_p_is_refused_not_shifted(version: str) -> None:
    """The rows of a request sent with P - 1, decoded with the P the caller asked for, are one
    row per token from P in count but start at P - 1: every row would land one token late."""
    p, g = 6, 3
    routes = distinct_routes(META, p + g - 1, seed=5)
    sent = _fields(p, p, version)["routed_experts_prompt_start"]
    assert sent == p - 1
    out = _answer("0.22-0.31", p, g, routes, sent, version)
    with pytest.raises(AlignmentError, match=r"sent with prompt_start=5.*G4"):
        list(decode_vllm_output(out, DecodeOptions(meta=META, prompt_start=p)))
    with pytest.raises(AlignmentError, match="G4"):
        decode_vllm_output([out], DecodeOptions(meta=META, prompt_start=p)).to_batch()
