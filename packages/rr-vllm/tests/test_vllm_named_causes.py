"""Errors that name their cause: an SGLang version that does not parse names SGLang,
not vLLM; decode_vllm_batch given one prompt start for requests sent with different ones says
which starts to pass (vLLM's own RequestOutput where vllm imports)."""

from __future__ import annotations

import pytest

from rr_fakes.emulations.engines import vllm_request_output
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineOutputError,
    decode_vllm_output,
)
from rr_vllm.releases import sglang_flags
from vllm_testing import META, distinct_routes


@pytest.mark.parametrize(
    ("version", "named"),
    [
        ("main", "cannot parse the SGLang version 'main'"),
        (0.5, "the SGLang version must be a string"),
    ],
)
def test_an_unparseable_sglang_version_names_sglang(version: object, named: str) -> None:
    with pytest.raises(CaptureError, match=named) as caught:
        sglang_flags(version)  # type: ignore[arg-type]
    assert "vLLM" not in str(caught.value)


def request(name: str, p: int, g: int, start: int) -> object:
    return vllm_request_output(
        "0.32+",
        prompt_ids=range(p),
        generated_ids=range(100, 100 + g),
        routes_TLK=distinct_routes(META, p + g - 1, seed=p),
        num_experts=8,
        prompt_start=start,
        request_id=name,
    )


def test_one_start_for_requests_sent_with_different_starts_says_what_to_pass() -> None:
    requests = [request("a", 5, 3, 0), request("b", 6, 2, 4), request("c", 4, 4, 1)]
    with pytest.raises(EngineOutputError, match=r"pass prompt_starts=\[0, 4, 1\]"):
        decode_vllm_output(requests, DecodeOptions(meta=META)).to_batch()
    batch = decode_vllm_output(
        requests, DecodeOptions(meta=META), prompt_starts=[0, 4, 1]
    ).to_batch()
    for b, (r, start) in enumerate(zip(requests, [0, 4, 1], strict=True)):
        (sample,) = decode_vllm_output(r, DecodeOptions(meta=META, prompt_start=start))
        values, valid = batch.sequence(b)
        assert valid.tolist() == sample.valid_T.tolist()
        assert (values.numpy() == sample.routes_TLK).all()
