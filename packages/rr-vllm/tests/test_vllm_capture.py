"""Turning capture on: version flags, engine arguments, sampling and SGLang request fields, the
0.32+ aux-output store and its eviction error (E3 hybrid attention, E2 physical ids)."""

from __future__ import annotations

import importlib.metadata
import sys
from types import SimpleNamespace

import pytest

from rr_core import RouteMeta
from rr_fakes.emulations.engines import BlockObjectStoreError
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineOutputError,
    ModelGeometry,
    RouteStoreEvictedError,
    decode_vllm_http,
    explain_store_errors,
    installed_vllm_version,
    is_store_eviction,
    max_new_tokens,
    routes_store_max_bytes,
    sglang_request_fields,
    vllm_engine_args,
    vllm_flags,
    vllm_sampling_fields,
)
from rr_vllm._supported import VLLM_FEATURES
from vllm_testing import make_meta

QWEN3_30B = ModelGeometry(num_hidden_layers=48, num_experts=128, top_k=8)
HYBRID = ModelGeometry(num_hidden_layers=40, num_experts=256, top_k=8, hybrid_attention=True)


# --- version flags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.13.0", set()),
        ("0.14.0", {"capture"}),
        ("0.15.1", {"capture"}),
        ("0.16.0", {"capture", "logical_ids"}),
        ("0.20.2", {"capture", "logical_ids"}),
        ("0.21.0", {"capture", "logical_ids", "split_arrays"}),
        ("0.21.1rc2", {"capture", "logical_ids", "split_arrays"}),
        ("0.22.0", {"capture", "logical_ids", "prompt_start", "hybrid_attention", "compact_dtype"}),
        (
            "0.22.0rc1",
            {"capture", "logical_ids", "prompt_start", "hybrid_attention", "compact_dtype"},
        ),
        (
            "0.31.9",
            {
                "capture",
                "logical_ids",
                "prompt_start",
                "hybrid_attention",
                "compact_dtype",
                "prompt_start_whole_prompt",
                "stream_routes",
            },
        ),
        ("0.32.0", set(VLLM_FEATURES) - {"split_arrays"}),
        ("0.33.0+cu128", set(VLLM_FEATURES) - {"split_arrays"}),
    ],
)
def test_version_flags_come_from_the_table(version: str, expected: set[str]) -> None:
    flags = vllm_flags(version)
    assert {name for name in VLLM_FEATURES if getattr(flags, name)} == expected
    assert vllm_flags(version) is flags  # computed once


def test_supported_range() -> None:
    assert vllm_flags("0.34.0").supported
    assert not vllm_flags("0.35.0").supported
    assert not vllm_flags("0.13.0").supported
    with pytest.raises(CaptureError, match="cannot parse"):
        vllm_flags("not-a-version")


def test_installed_version_is_read_from_metadata_without_importing_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = "vllm" in sys.modules
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.21.0")
    assert installed_vllm_version() == "0.21.0"
    assert vllm_engine_args(QWEN3_30B) == {"enable_return_routed_experts": True}
    assert ("vllm" in sys.modules) == before

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert installed_vllm_version() is None
    with pytest.raises(CaptureError, match="vllm_version="):
        vllm_engine_args(QWEN3_30B)


# --- engine arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.12.0", "0.13.2"])
def test_before_0_14_capture_is_refused(version: str) -> None:
    with pytest.raises(CaptureError, match=r"0\.14"):
        vllm_engine_args(QWEN3_30B, vllm_version=version)
    with pytest.raises(CaptureError, match=r"0\.14"):
        vllm_sampling_fields(
            3, prompt_length=8, response_length=8, max_model_len=64, vllm_version=version
        )


@pytest.mark.parametrize("version", ["0.14.0", "0.21.0", "0.22.0", "0.31.0"])
def test_engine_args_before_the_store(version: str) -> None:
    assert vllm_engine_args(QWEN3_30B, vllm_version=version) == {
        "enable_return_routed_experts": True
    }


@pytest.mark.parametrize("version", ["0.14.0", "0.20.0", "0.21.1"])
def test_e3_hybrid_attention_before_0_22_is_refused(version: str) -> None:
    with pytest.raises(CaptureError, match=r"E3.*0\.22"):
        vllm_engine_args(HYBRID, vllm_version=version)


def test_e3_hybrid_attention_from_0_22_is_fine() -> None:
    assert vllm_engine_args(HYBRID, vllm_version="0.22.0")["enable_return_routed_experts"]


def test_e2_eplb_before_0_16_is_refused() -> None:
    with pytest.raises(CaptureError, match="E2"):
        vllm_engine_args(QWEN3_30B, vllm_version="0.15.0", enable_eplb=True)
    assert vllm_engine_args(QWEN3_30B, vllm_version="0.16.0", enable_eplb=True)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_store_era_args(version: str) -> None:
    args = vllm_engine_args(QWEN3_30B, vllm_version=version)
    assert args == {
        "enable_prefix_caching": True,
        "aux_output_config": {"enable_return_routed_experts": True},
    }
    sized = vllm_engine_args(QWEN3_30B, vllm_version=version, max_cached_tokens=100_000)
    assert sized["aux_output_config"]["max_bytes"] == 100_000 * 48 * 8 * 5 // 4
    with pytest.raises(CaptureError, match="prefix caching"):
        vllm_engine_args(QWEN3_30B, vllm_version=version, enable_prefix_caching=False)


def test_store_bytes_per_token_follow_the_dtype() -> None:
    assert QWEN3_30B.route_bytes_per_token == 384  # uint8, the facts' table
    wide = ModelGeometry(num_hidden_layers=60, num_experts=384, top_k=8)
    assert wide.route_bytes_per_token == 960  # uint16
    assert routes_store_max_bytes(QWEN3_30B, 10, headroom=1.0) == 3840
    with pytest.raises(ValueError, match="num_tokens"):
        routes_store_max_bytes(QWEN3_30B, 0)


def test_geometry_from_hf_configs() -> None:
    qwen3 = {"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}
    assert ModelGeometry.from_hf_config(qwen3) == QWEN3_30B
    deepseek = SimpleNamespace(num_hidden_layers=61, n_routed_experts=256, num_experts_per_tok=8)
    assert ModelGeometry.from_hf_config(deepseek).num_experts == 256
    qwen35 = {
        "text_config": {
            "num_hidden_layers": 4,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        }
    }
    assert ModelGeometry.from_hf_config(qwen35).hybrid_attention
    with pytest.raises(CaptureError, match="expert count"):
        ModelGeometry.from_hf_config({"num_hidden_layers": 2, "num_experts_per_tok": 2})
    with pytest.raises(CaptureError, match="top_k"):
        ModelGeometry(num_hidden_layers=2, num_experts=4, top_k=8)


def test_geometry_from_meta() -> None:
    meta = make_meta(layers=3, dense=(1,))  # 8 experts, top-2
    assert ModelGeometry.from_meta(meta) == ModelGeometry(
        num_hidden_layers=3, num_experts=8, top_k=2
    )
    moe = RouteMeta(num_experts=8, top_k=2, layer_axis="moe_layers", layer_numbers=(2, 3))
    with pytest.raises(CaptureError, match="all_layers"):
        ModelGeometry.from_meta(moe)


# --- per-request fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "kw", "expected"),
    [
        (10, {}, 16),  # P <= prompt_length: the whole response budget
        (1, {}, 16),
        (100, {"max_model_len": 110}, 10),  # clamped to the context window
        (100, {"max_model_len": 101}, 1),
    ],
)
def test_max_tokens_cap_and_clamp(p: int, kw: dict[str, int], expected: int) -> None:
    args = {"prompt_length": 128, "response_length": 16, "max_model_len": 4096, **kw}
    assert max_new_tokens(p, **args) == expected


def test_max_tokens_for_a_continuation_uses_the_remaining_budget() -> None:
    # a later turn: context 20 > prompt_length 8; budget 8 + 16 - 20 = 4
    assert (
        max_new_tokens(20, prompt_length=8, response_length=16, max_model_len=64, continuation=True)
        == 4
    )
    with pytest.raises(CaptureError, match="no room"):
        max_new_tokens(24, prompt_length=8, response_length=16, max_model_len=64, continuation=True)


def test_prompt_longer_than_prompt_length_is_refused() -> None:
    with pytest.raises(CaptureError, match="more than prompt_length=8"):
        max_new_tokens(9, prompt_length=8, response_length=16, max_model_len=64)
    with pytest.raises(CaptureError, match="no room"):
        max_new_tokens(64, prompt_length=64, response_length=16, max_model_len=64)
    with pytest.raises(CaptureError, match=">= 1"):
        max_new_tokens(3, prompt_length=0, response_length=16, max_model_len=64)


def _fields(version: str, **kw: int) -> dict[str, int]:
    """vLLM ``version``'s sampling fields for a 5-token prompt, 8 + 16 tokens, a 64-token model."""
    return vllm_sampling_fields(
        5, prompt_length=8, response_length=16, max_model_len=64, vllm_version=version, **kw
    )


@pytest.mark.parametrize("version", ["0.22.0", "0.33.0"])
@pytest.mark.parametrize("prompt_start", [0, 3, 5])
def test_sampling_fields_with_prompt_start(version: str, prompt_start: int) -> None:
    fields = _fields(version, prompt_start=prompt_start)
    # P = 5 kills the EngineCore of 0.22-0.29 (G4): P - 1 goes out there
    sent = 4 if (version, prompt_start) == ("0.22.0", 5) else prompt_start
    assert fields == {"max_tokens": 16, "routed_experts_prompt_start": sent}


@pytest.mark.parametrize("version", ["0.14.0", "0.21.0"])
def test_prompt_start_before_0_22(version: str) -> None:
    fields = _fields(version)
    assert fields == {"max_tokens": 16}
    with pytest.raises(CaptureError, match=r"0\.22"):
        _fields(version, prompt_start=2)


@pytest.mark.parametrize("prompt_start", [-1, 6])
def test_prompt_start_outside_the_prompt_is_refused(prompt_start: int) -> None:
    with pytest.raises(CaptureError, match=r"outside 0\.\.P=5"):
        _fields("0.33.0", prompt_start=prompt_start)


def test_sglang_request_fields() -> None:
    body = sglang_request_fields(5, prompt_length=8, response_length=16, max_model_len=18)
    assert body == {"return_routed_experts": True, "sampling_params": {"max_new_tokens": 13}}
    body = sglang_request_fields(
        5, prompt_length=8, response_length=16, max_model_len=64, start_len=5
    )
    assert body["routed_experts_start_len"] == 5
    with pytest.raises(CaptureError, match="start_len=6"):
        sglang_request_fields(5, prompt_length=8, response_length=16, max_model_len=64, start_len=6)
    with pytest.raises(CaptureError, match="prompt_length"):
        sglang_request_fields(9, prompt_length=8, response_length=16, max_model_len=64)


# --- the 0.32+ store ----------------------------------------------------------------------------


def test_block_object_store_error_is_explained_with_max_bytes() -> None:
    guard = explain_store_errors(geometry=QWEN3_30B, max_cached_tokens=1000)
    with pytest.raises(RouteStoreEvictedError, match=r"max_bytes.*2x 1000 cached") as info, guard:
        raise BlockObjectStoreError("prefix hit needs evicted rows")
    assert isinstance(info.value, EngineOutputError)
    assert isinstance(info.value.__cause__, BlockObjectStoreError)


def test_store_error_wrapped_by_the_engine_is_found_in_the_chain() -> None:
    outer = RuntimeError("EngineCore failed")
    outer.__cause__ = BlockObjectStoreError("auxiliary output publication failed")
    assert is_store_eviction(outer)
    assert is_store_eviction("auxiliary output object does not exist; the object may have been")
    assert not is_store_eviction(RuntimeError("CUDA out of memory"))


def test_other_errors_pass_through_the_guard() -> None:
    with pytest.raises(KeyError), explain_store_errors():
        raise KeyError("x")


META = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2))


@pytest.mark.parametrize(
    "body",
    [
        {
            "error": {
                "message": "BlockObjectStoreError: auxiliary output object does not exist",
                "type": "InternalServerError",
                "code": 500,
            }
        },
        {"object": "error", "message": "x", "type": "BlockObjectStoreError", "code": 500},
    ],
)
def test_http_store_eviction_body(body: dict[str, object]) -> None:
    with pytest.raises(RouteStoreEvictedError, match="max_bytes"):
        decode_vllm_http(body, DecodeOptions(meta=META))


def test_http_other_error_body() -> None:
    body = {"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}
    with pytest.raises(EngineOutputError, match="prompt too long") as info:
        decode_vllm_http(body, DecodeOptions(meta=META))
    assert not isinstance(info.value, RouteStoreEvictedError)
