"""decode_vllm_output takes one routed_experts_prompt_start per request: a rollout mixes fresh
prompts (start 0) with continuations sent with a start, and one value for the whole batch
either raises (row counts) or shifts every other request's rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rr_core import RouteMeta, RRError
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    decode_vllm_output,
    validate_samples,
)

META = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2))


def _request(name: str, prompt: list[int], generated: list[int], start: int) -> SimpleNamespace:
    T = len(prompt) + len(generated)
    rng = np.random.default_rng(len(name))
    rows = np.stack([rng.permutation(8)[:2] for _ in range((T - 1 - start) * 2)])
    rows = rows.reshape(T - 1 - start, 2, 2).astype(np.uint8)
    completion = SimpleNamespace(
        index=0, token_ids=generated, finish_reason="length", routed_experts=rows
    )
    return SimpleNamespace(request_id=name, prompt_token_ids=prompt, outputs=[completion])


@pytest.mark.parametrize("dtype", ["uint8", "int32"])  # the direct copy and the sample path
def test_each_request_is_decoded_with_its_own_prompt_start(dtype: str) -> None:
    starts = [0, 3, 1]
    requests = [
        _request("a", [11, 12, 13], [21, 22], 0),
        _request("b", [11, 12, 13, 14, 15], [23], 3),
        _request("c", [16, 17], [24, 25, 26], 1),
    ]
    for r in requests:
        r.outputs[0].routed_experts = r.outputs[0].routed_experts.astype(dtype)
    batch = decode_vllm_output(requests, DecodeOptions(meta=META), prompt_starts=starts).to_batch()
    expected = validate_samples(
        [
            s
            for r, start in zip(requests, starts, strict=True)
            for s in decode_vllm_output(r, DecodeOptions(meta=META, prompt_start=start))
        ],
        META,
    )
    assert batch.valid_N.tolist() == expected.valid_N.tolist()
    assert (batch.values_NLK.long() == expected.values_NLK.long()).all()
    for b, (r, start) in enumerate(zip(requests, starts, strict=True)):
        values, valid = batch.sequence(b)
        assert int(valid.sum()) == values.shape[0] - 1 - start
        np.testing.assert_array_equal(values[valid].numpy(), r.outputs[0].routed_experts)


def test_one_start_for_a_mixed_batch_is_refused_by_the_row_counts() -> None:
    requests = [_request("a", [11, 12, 13], [21, 22], 0), _request("b", [11, 12, 13], [23], 2)]
    with pytest.raises(RRError, match="prompt_start=0"):
        decode_vllm_output(requests, DecodeOptions(meta=META, prompt_start=0)).to_batch()


@pytest.mark.parametrize("bad", [[0], [0, 1, 2], "01", [0, 1.0], [True, 0]])
def test_prompt_starts_that_do_not_name_each_request_raise(bad: object) -> None:
    requests = [_request("a", [11, 12, 13], [21, 22], 0), _request("b", [11, 12], [23], 0)]
    with pytest.raises(EngineOutputError, match="prompt_start"):
        decode_vllm_output(requests, DecodeOptions(meta=META), prompt_starts=bad).to_batch()  # type: ignore[arg-type]
