"""Emulated engine outputs: every vLLM era's shapes, dtypes and rows, the wire forms and each
failure knob (vllm-facts.md, failure-modes.md E1-E6, D3)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import numpy as np
import pytest

from rr_fakes.emulations.engines import (
    BlockObjectStoreError,
    CompletionOutput,
    Faults,
    RequestOutput,
    VllmEra,
    decode_npy_base64,
    decode_sglang_routes,
    encode_npy_base64,
    era_of,
    real_vllm_outputs,
    sglang_response,
    vllm_http_response,
    vllm_request_output,
)

P, G, L, K = 5, 4, 4, 2
DENSE = (1,)  # layer 1 is dense: all-zero rows on the all-layers axis
MOE_LAYERS = (2, 3, 4)


def _routes(num_experts: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = np.stack(
        [np.stack([rng.permutation(num_experts)[:K] for _ in range(L)]) for _ in range(P + G - 1)]
    )
    ids[:, [d - 1 for d in DENSE]] = 0
    return ids.astype(np.int64)


def _build(era: VllmEra | str, num_experts: int = 8, **kw: Any) -> Any:
    routes = kw.pop("routes", None)
    return vllm_request_output(
        era,
        prompt_ids=list(range(100, 100 + P)),
        generated_ids=list(range(200, 200 + G)),
        routes_TLK=_routes(num_experts) if routes is None else routes,
        num_experts=num_experts,
        moe_layer_numbers=MOE_LAYERS,
        **kw,
    )


def test_era_of() -> None:
    assert era_of("0.14.0") is VllmEra.V0_14
    assert era_of("0.20.2") is VllmEra.V0_14
    assert era_of("0.21.0") is VllmEra.V0_21
    assert era_of("0.22.0rc1") is VllmEra.V0_22
    assert era_of("0.31.0") is VllmEra.V0_22
    assert era_of("0.32.0") is VllmEra.V0_32
    assert era_of("0.33.0+cpu") is VllmEra.V0_32
    with pytest.raises(ValueError, match=r"0\.14"):
        era_of("0.13.1")


@pytest.mark.skipif(real_vllm_outputs() is not None, reason="checks the duck-typed classes")
def test_duck_typed_objects_carry_vllm_field_names() -> None:
    out = _build(VllmEra.V0_14)
    assert isinstance(out, RequestOutput)
    assert isinstance(out.outputs[0], CompletionOutput)
    names = {f.name for f in dataclasses.fields(CompletionOutput)}
    assert {"index", "text", "token_ids", "routed_experts", "finish_reason"} <= names
    assert {"request_id", "prompt_token_ids", "outputs", "finished", "num_cached_tokens"} <= {
        f.name for f in dataclasses.fields(RequestOutput)
    }
    with pytest.raises(ImportError):
        _build(VllmEra.V0_14, use_real_vllm=True)


def test_v0_14_int32_all_layers_p_plus_g_minus_1() -> None:
    out = _build("0.14-0.20")
    routes = out.outputs[0].routed_experts
    assert routes.dtype == np.int32
    assert routes.shape == (P + G - 1, L, K)
    assert np.array_equal(routes, _routes())
    assert not routes[:, 0].any()  # the dense layer's rows are all zero
    assert not hasattr(out, "prompt_routed_experts")
    assert out.outputs[0].token_ids == list(range(200, 200 + G))


def test_v0_21_split_moe_only_int16() -> None:
    out = _build(VllmEra.V0_21, cached_prefix=2)
    prompt, generation = out.prompt_routed_experts, out.outputs[0].routed_experts
    assert prompt.dtype == generation.dtype == np.int16
    assert prompt.shape == (P, len(MOE_LAYERS), K)
    assert generation.shape == (G - 1, 3, K)
    expected = _routes()[:, [n - 1 for n in MOE_LAYERS]]
    assert (prompt[:2] == -1).all()
    assert np.array_equal(prompt[2:], expected[2:P])
    assert np.array_equal(generation, expected[P:])
    assert out.num_cached_tokens == 2


def test_v0_21_preempted_returns_none() -> None:
    out = _build(VllmEra.V0_21, preempted=True)
    assert out.prompt_routed_experts is None
    assert out.outputs[0].routed_experts is None
    assert out.outputs[0].finish_reason == "length"  # silently


@pytest.mark.parametrize("era", [VllmEra.V0_22, VllmEra.V0_32])
@pytest.mark.parametrize(
    ("num_experts", "dtype"), [(8, np.uint8), (256, np.uint8), (300, np.uint16)]
)
def test_v0_22_plus_narrow_dtype(era: VllmEra, num_experts: int, dtype: type) -> None:
    routes = _routes(num_experts)
    out = _build(era, num_experts, routes=routes)
    got = out.outputs[0].routed_experts
    assert got.dtype == dtype
    assert got.shape == (P + G - 1, L, K)
    assert np.array_equal(got.astype(np.int64), routes)


@pytest.mark.parametrize("prompt_start", [0, 3, P])
def test_prompt_start_skips_rows(prompt_start: int) -> None:
    got = _build(VllmEra.V0_22, prompt_start=prompt_start).outputs[0].routed_experts
    assert got.shape[0] == P + G - 1 - prompt_start
    assert np.array_equal(got, _routes()[prompt_start:])


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError, match="outside the valid"):
        _build(VllmEra.V0_32, prompt_start=P + 1)
    with pytest.raises(ValueError, match="does not exist"):
        _build(VllmEra.V0_14, prompt_start=1)
    with pytest.raises(ValueError, match="P\\+G-1"):
        _build(VllmEra.V0_14, routes=_routes()[:-1])
    with pytest.raises(BlockObjectStoreError, match="max_bytes"):
        _build(VllmEra.V0_32, evicted=True)


def test_http_base64_npy_round_trip() -> None:
    for num_experts in (8, 300):
        out = _build(VllmEra.V0_32, num_experts, routes=_routes(num_experts))
        body = vllm_http_response(out)
        text = body["choices"][0]["routed_experts"]
        assert base64.b64decode(text).startswith(b"\x93NUMPY")
        decoded = decode_npy_base64(text)
        assert decoded.dtype == out.outputs[0].routed_experts.dtype
        assert np.array_equal(decoded, out.outputs[0].routed_experts)
        assert body["choices"][0]["token_ids"] == list(range(200, 200 + G))
    assert np.array_equal(decode_npy_base64(encode_npy_base64(_routes())), _routes())
    missing = vllm_http_response(_build(VllmEra.V0_22, faults=Faults(missing=True)))
    assert missing["choices"][0]["routed_experts"] is None


def test_sglang_raw_int32_without_shape() -> None:
    body = sglang_response(
        prompt_ids=list(range(P)), generated_ids=list(range(G)), routes_TLK=_routes(), start_len=2
    )
    text = body["meta_info"]["routed_experts"]
    assert len(base64.b64decode(text)) == (P + G - 1 - 2) * L * K * 4  # no header
    flat = np.frombuffer(base64.b64decode(text), dtype=np.int32)
    assert flat.ndim == 1
    assert not flat.flags.writeable
    routes = decode_sglang_routes(text, L, K)
    assert np.array_equal(routes, _routes()[2:])
    assert not routes.flags.writeable
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": G}
    bare = sglang_response(
        prompt_ids=[1], generated_ids=[2], routes_TLK=_routes()[:1], faults=Faults(missing=True)
    )
    assert "routed_experts" not in bare["meta_info"]


# -- failure knobs -------------------------------------------------------------------------
def test_e1_all_zero_routes() -> None:
    got = _build(VllmEra.V0_22, faults=Faults(all_zero=True)).outputs[0].routed_experts
    assert got.shape == (P + G - 1, L, K)
    assert not got.any()


def test_e2_physical_ids() -> None:
    table = np.roll(np.arange(8), 3)
    got = _build(VllmEra.V0_14, faults=Faults(physical_map=table)).outputs[0].routed_experts
    assert np.array_equal(got, table[_routes()])
    per_layer = np.stack([np.roll(np.arange(8), s) for s in range(L)])
    got = _build(VllmEra.V0_14, faults=Faults(physical_map=per_layer)).outputs[0].routed_experts
    assert np.array_equal(got[:, 2], per_layer[2][_routes()[:, 2]])


def test_e4_uint8_overflow_above_256_experts() -> None:
    routes = _routes(300, seed=3)
    assert (routes >= 256).any()
    faults = Faults(uint8_overflow=True)
    got = _build(VllmEra.V0_22, 300, routes=routes, faults=faults).outputs[0].routed_experts
    assert got.dtype == np.uint8
    assert np.array_equal(got, routes % 256)
    assert not np.array_equal(got, routes)


def test_e6_draft_model_overwrites_layer0() -> None:
    faults = Faults(draft_layer0=7)
    got = _build(VllmEra.V0_22, faults=faults).outputs[0].routed_experts
    assert np.array_equal(got[:, 1:], _routes()[:, 1:])
    assert got[:, 0].any()  # the dense layer 1 now carries the draft's ids
    draft = np.ones((P + G - 1, K), dtype=np.int64)
    got21 = _build(VllmEra.V0_21, faults=Faults(draft_layer0=draft)).prompt_routed_experts
    assert (got21[:, 0] == 1).all()  # 0.21: slot 0 of the MoE-only axis


def test_aborted_request_returns_short_rows() -> None:
    out = _build(VllmEra.V0_22, faults=Faults(abort_after_rows=3))
    assert out.outputs[0].finish_reason == "abort"
    assert out.outputs[0].routed_experts.shape[0] == 3 < P + G - 1
    split = _build(VllmEra.V0_21, faults=Faults(abort_after_rows=P - 1))
    assert split.prompt_routed_experts.shape[0] == P - 1
    assert split.outputs[0].routed_experts.shape[0] == 0


@pytest.mark.parametrize("era", list(VllmEra))
def test_read_only_arrays(era: VllmEra) -> None:
    out = _build(era, faults=Faults(read_only=True))
    got = out.outputs[0].routed_experts
    assert not got.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        got[0, 0, 0] = 1
    assert _build(era).outputs[0].routed_experts.flags.writeable
