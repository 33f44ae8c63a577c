"""The adapter against the real vLLM classes (vllm installed without its CUDA dependencies, on CPU
torch): ``CompletionOutput`` / ``RequestOutput`` (with ``RequestOutput.add`` aggregation),
``SamplingParams`` with the fields rr_vllm generates, ``EngineArgs`` / ``AuxOutputConfig`` with
its engine arguments, ``numpy2base64`` and the 0.32+ ``BlockObjectStoreError``. Skipped where
vllm does not import."""

from __future__ import annotations

import copy
import importlib
from typing import Any

import numpy as np
import pytest

outputs = pytest.importorskip("vllm.outputs", reason="vllm is not installed")
vllm = importlib.import_module("vllm")

from rr_fakes.emulations.engines import VllmEra, vllm_http_response  # noqa: E402
from rr_vllm import (  # noqa: E402
    DecodeOptions,
    ModelGeometry,
    RouteStoreEvictedError,
    decode_vllm_http,
    decode_vllm_output,
    explain_store_errors,
    installed_vllm_version,
    validate_samples,
    vllm_engine_args,
    vllm_flags,
    vllm_sampling_fields,
)
from vllm_testing import META, distinct_routes, fake_vllm_output  # noqa: E402

P, G = 5, 4


def routes(rows: int = P + G - 1, seed: int = 0) -> np.ndarray:
    return distinct_routes(META, rows, seed)


def build(era: VllmEra, rows: np.ndarray, **kw: Any) -> Any:
    return fake_vllm_output(era, META, rows, P, G, use_real_vllm=True, **kw)


def test_installed_version_matches_without_import() -> None:
    assert installed_vllm_version() == vllm.__version__
    assert vllm_flags(vllm.__version__).supported


@pytest.mark.parametrize("era", list(VllmEra))
def test_real_classes_decode(era: VllmEra) -> None:
    rows = routes()
    out = build(era, rows)
    assert isinstance(out, outputs.RequestOutput)
    assert isinstance(out.outputs[0], outputs.CompletionOutput)
    (s,) = decode_vllm_output(out, DecodeOptions(meta=META))
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[:-1], rows)
    batch = validate_samples([s], META)
    assert (
        decode_vllm_output([out, out], DecodeOptions(meta=META))
        .to_batch()
        .equal(validate_samples([s, s], META))
    )
    assert batch.num_tokens == P + G


def test_request_output_add_keeps_the_terminal_routes() -> None:
    rows = routes()
    final = build(VllmEra.V0_32, rows)
    c = final.outputs[0]
    first = outputs.CompletionOutput(
        index=0,
        text="",
        token_ids=list(c.token_ids[:2]),
        cumulative_logprob=None,
        logprobs=None,
    )
    last = copy.copy(c)
    last.token_ids = list(c.token_ids[2:])

    def answer(completion: Any, finished: bool) -> Any:
        return outputs.RequestOutput(
            request_id="r",
            prompt=None,
            prompt_token_ids=list(range(P)),
            prompt_logprobs=None,
            outputs=[completion],
            finished=finished,
        )

    agg = answer(first, finished=False)
    agg.add(answer(last, finished=True), aggregate=True)
    assert list(agg.outputs[0].token_ids) == list(c.token_ids)
    (s,) = decode_vllm_output(agg, DecodeOptions(meta=META))
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[:-1], rows)


def test_numpy2base64_round_trip() -> None:
    serial = pytest.importorskip("vllm.utils.serial_utils")
    rows = routes().astype(np.uint8)
    body = vllm_http_response(build(VllmEra.V0_32, rows))
    body["choices"][0]["routed_experts"] = serial.numpy2base64(rows)
    (s,) = decode_vllm_http(body, DecodeOptions(meta=META))
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[:-1], rows)


@pytest.mark.parametrize("prompt_start", [0, 2, P])
def test_sampling_params_take_the_generated_fields(prompt_start: int) -> None:
    from vllm.sampling_params import SamplingParams

    fields = vllm_sampling_fields(
        P, prompt_length=8, response_length=16, max_model_len=64, prompt_start=prompt_start
    )
    params = SamplingParams(**fields)
    assert params.max_tokens == 16
    assert params.routed_experts_prompt_start == prompt_start
    out = build(VllmEra.V0_32, routes(), prompt_start=prompt_start)
    (s,) = decode_vllm_output(
        out, DecodeOptions(meta=META, prompt_start=params.routed_experts_prompt_start)
    )
    assert s is not None
    assert s.valid_T.sum() == P + G - 1 - prompt_start


def test_engine_args_are_accepted_by_the_real_engine_args() -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    geometry = ModelGeometry(num_hidden_layers=48, num_experts=128, top_k=8)
    args = vllm_engine_args(geometry, max_cached_tokens=1000)
    engine = arg_utils.EngineArgs(model="unused", **args)
    assert engine.enable_prefix_caching
    aux = engine.aux_output_config
    assert aux.enable_return_routed_experts
    assert aux.max_bytes == args["aux_output_config"]["max_bytes"]


def test_real_block_object_store_error_is_explained() -> None:
    store = pytest.importorskip("vllm.distributed.aux_output_connector.store")
    with pytest.raises(RouteStoreEvictedError, match="max_bytes"), explain_store_errors():
        raise store.BlockObjectStoreError("auxiliary output object does not exist")
