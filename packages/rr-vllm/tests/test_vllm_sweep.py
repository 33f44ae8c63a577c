"""Property sweep over rr_vllm's data-facing entry points: every call on generated input, valid
or not, returns a result that passes the entry point's own invariant or raises an RRError
subclass, never a bare IndexError/RuntimeError/KeyError/TypeError from inside, never a silently
wrong answer.

Entry points covered:

- ``DecodeOptions`` (construction checks)
- ``decode_routes_array``, ``decode_vllm_output``, ``decode_vllm_batch`` (vLLM answers built
  by rr_fakes, and duck-typed answers with generated fields)
- ``npy_base64_to_array``, ``sglang_base64_to_array``, ``decode_sglang``
- ``validate_samples``, ``flatten_completions``, ``truncate_sample``, ``drop_rows_before``,
  ``merge_split_routes``, ``to_trainer_layout``, ``omission_start``, ``prompt_start_to_send``
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rr_vllm
from rr_core import RouteMeta
from rr_fakes.emulations.engines import vllm_request_output
from rr_fakes.pytest_support import settles
from rr_fakes.sweeps import ANYTHING, JUNK, SWEEP, public_api_tests
from rr_vllm import DecodeOptions, SampleRoutes

E, L, K = 8, 3, 2
META = RouteMeta(num_experts=E, top_k=K, layer_axis="all_layers", layer_numbers=(1, 2, 3))
OPTIONS = DecodeOptions(meta=META)


def routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = np.array([rng.permutation(E)[:K] for _ in range(rows * L)], dtype=np.uint8)
    return ids.reshape(rows, L, K)


@st.composite
def arrays(draw: st.DrawFn) -> Any:
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.int32, np.int64, np.float32, np.bool_]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))
    if dtype is np.bool_:
        return draw(hnp.arrays(dtype, shape))
    if dtype is np.float32:
        return draw(hnp.arrays(dtype, shape, elements=st.floats(-1, 9, width=32)))
    lo = 0 if dtype is np.uint8 else -2
    return draw(hnp.arrays(dtype, shape, elements=st.integers(lo, 12)))


def check_sample(sample: SampleRoutes, P: int, G: int) -> None:
    """The decoders' invariant: a row per token, zeros where invalid, ids in [0, E) where
    valid (after validation)."""
    T = P + G
    assert sample.routes_TLK.shape == (T, L, K)
    assert sample.valid_T.shape == (T,)
    assert not sample.routes_TLK[~sample.valid_T].any()
    assert sample.num_prompt_tokens == P


@SWEEP
@given(
    ps=st.one_of(st.integers(-2, 6), JUNK),
    on_abort=st.one_of(st.sampled_from(["mask", "drop", "keep"]), JUNK),
    logical=st.one_of(st.none(), st.integers(-1, 12), JUNK),
    version=st.one_of(st.none(), st.sampled_from(["0.22.0", "banana", "0.21"]), JUNK),
)
def test_decode_options(ps: Any, on_abort: Any, logical: Any, version: Any) -> None:
    ok, opts = settles(
        DecodeOptions,
        meta=META,
        prompt_start=ps,
        on_abort=on_abort,
        logical_experts=logical,
        engine_version=version,
    )
    if ok:
        assert opts.prompt_start >= 0
    settles(DecodeOptions, meta=ps)


@SWEEP
@given(
    array=st.one_of(arrays(), JUNK),
    P=st.one_of(st.integers(-1, 5), JUNK),
    G=st.one_of(st.integers(-1, 5), JUNK),
    ps=st.integers(0, 5),
    finish=st.one_of(st.sampled_from(["length", "stop", "abort", None]), JUNK),
)
def test_decode_routes_array(array: Any, P: Any, G: Any, ps: int, finish: Any) -> None:
    ok, decoded = settles(
        rr_vllm.decode_routes_array,
        array,
        DecodeOptions(meta=META, prompt_start=ps),
        num_prompt_tokens=P,
        num_generated_tokens=G,
        finish_reason=finish,
    )
    sample = decoded.only() if ok else None
    if sample is not None:
        check_sample(sample, P, G)
        settles(rr_vllm.validate_samples, [sample], META, allow_all_zero=True)


@SWEEP
@given(
    P=st.integers(1, 5),
    G=st.integers(1, 4),
    ps=st.integers(0, 5),
    era=st.sampled_from(["0.22-0.31", "0.32+"]),
    seed=st.integers(0, 100),
    cut=st.integers(-2, 9),
)
def test_decode_vllm_output(P: int, G: int, ps: int, era: str, seed: int, cut: int) -> None:
    ps = min(ps, P)
    out = vllm_request_output(
        era,
        prompt_ids=list(range(P)),
        generated_ids=list(range(G)),
        routes_TLK=routes(P + G - 1, seed),
        num_experts=E,
        prompt_start=ps,
        use_real_vllm=False,  # the duck-typed classes: the real ones are test_vllm_real's
    )
    samples = rr_vllm.decode_vllm_output(out, DecodeOptions(meta=META, prompt_start=ps))
    check_sample(samples[0], P, G)
    batch = rr_vllm.decode_vllm_output([out], DecodeOptions(meta=META, prompt_start=ps)).to_batch()
    assert batch.num_tokens == P + G
    assert torch.equal(batch.valid_N, torch.from_numpy(samples[0].valid_T))
    # the same answer read with another prompt_start than it was sent with
    other = DecodeOptions(meta=META, prompt_start=(ps + 1) % (P + 1))
    settles(lambda: list(rr_vllm.decode_vllm_output(out, other)))
    ok, cut_sample = settles(rr_vllm.truncate_sample, samples[0], cut)
    if ok:
        assert cut_sample.routes_TLK.shape[0] == cut
        assert np.array_equal(cut_sample.routes_TLK, samples[0].routes_TLK[:cut])
    ok, dropped = settles(rr_vllm.drop_rows_before, samples[0], cut)
    if ok:
        assert not dropped.valid_T[:cut].any()
        assert np.array_equal(dropped.valid_T[cut:], samples[0].valid_T[cut:])


@SWEEP
@given(
    token_ids=st.one_of(st.lists(st.integers(0, 9), max_size=4), JUNK),
    prompt_ids=st.one_of(st.lists(st.integers(0, 9), max_size=4), JUNK),
    routed=st.one_of(arrays(), JUNK),
    finish=st.one_of(st.sampled_from(["length", "abort"]), JUNK),
    outputs=st.sampled_from(["one", "none", "junk"]),
)
def test_decode_duck_typed(
    token_ids: Any, prompt_ids: Any, routed: Any, finish: Any, outputs: str
) -> None:
    completion = SimpleNamespace(
        index=0, token_ids=token_ids, routed_experts=routed, finish_reason=finish
    )
    listed = {"one": [completion], "none": [], "junk": [None]}[outputs]
    request = SimpleNamespace(
        request_id="r", prompt_token_ids=prompt_ids, outputs=listed, num_cached_tokens=None
    )
    ok, samples = settles(lambda: list(rr_vllm.decode_vllm_output(request, OPTIONS)))
    if ok:
        for sample in samples:
            if sample is not None:
                check_sample(sample, len(prompt_ids or []), len(token_ids))  # None: no prompt
    ok, batch = settles(lambda: rr_vllm.decode_vllm_output([request], OPTIONS).to_batch())
    if ok:
        batch.validate(allow_all_zero=True)
    settles(lambda: rr_vllm.decode_vllm_output(request, OPTIONS).to_batch())


@SWEEP
@given(
    data=st.one_of(st.binary(max_size=40), st.text(max_size=12), JUNK),
    layers=st.one_of(st.integers(-1, 4), JUNK),
    k=st.one_of(st.integers(-1, 3), JUNK),
)
def test_base64_wires(data: Any, layers: Any, k: Any) -> None:
    text = base64.b64encode(data).decode() if isinstance(data, bytes) else data
    ok, array = settles(rr_vllm.npy_base64_to_array, text)
    if ok:
        assert isinstance(array, np.ndarray)
    ok, array = settles(rr_vllm.sglang_base64_to_array, text, layers, k)
    if ok:
        assert array.shape[1:] == (layers, k)
        assert array.shape[0] * layers * k * 4 == len(data)


@SWEEP
@given(
    P=st.integers(0, 4),
    G=st.integers(0, 4),
    shape_rows=st.integers(-1, 2),
    meta_info=st.sampled_from(["ok", "missing", "junk"]),
    finish=st.one_of(st.sampled_from(["length", "abort"]), JUNK),
)
def test_decode_sglang(P: int, G: int, shape_rows: int, meta_info: str, finish: Any) -> None:
    rows = max(P + G - 1 + shape_rows, 0)
    raw = routes(rows, 1).astype("<i4").tobytes()
    info: Any = {
        "prompt_tokens": P,
        "completion_tokens": G,
        "finish_reason": {"type": finish},
        "routed_experts": base64.b64encode(raw).decode(),
    }
    if meta_info == "missing":
        del info["routed_experts"]
    response: Any = {"meta_info": info if meta_info != "junk" else 3, "output_ids": [0] * G}
    ok, sample = settles(lambda: rr_vllm.decode_sglang(response, OPTIONS).only())
    if ok and sample is not None:
        check_sample(sample, P, G)
    settles(rr_vllm.decode_sglang, None, OPTIONS)


@st.composite
def samples(draw: st.DrawFn) -> SampleRoutes:
    P, G = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sample = rr_vllm.decode_routes_array(
        routes(P + G - 1, draw(st.integers(0, 50))),
        DecodeOptions(meta=META),
        num_prompt_tokens=P,
        num_generated_tokens=G,
    ).only()
    assert sample is not None
    return sample


@SWEEP
@given(prefill=samples(), decode=samples())
def test_merge_split_routes(prefill: SampleRoutes, decode: SampleRoutes) -> None:
    ok, merged = settles(rr_vllm.merge_split_routes, prefill, decode)
    if ok:
        P = prefill.num_prompt_tokens
        assert merged.routes_TLK.shape[0] == decode.routes_TLK.shape[0]
        assert np.array_equal(
            merged.routes_TLK[prefill.prompt_start : P],
            prefill.routes_TLK[prefill.prompt_start : P],
        )
        assert np.array_equal(merged.routes_TLK[P:], decode.routes_TLK[P:])
    settles(rr_vllm.merge_split_routes, prefill, None)


@SWEEP
@given(
    items=st.lists(st.one_of(samples(), st.none()), min_size=0, max_size=3),
    prompt_length=st.one_of(st.integers(-1, 6), JUNK),
    response_length=st.one_of(st.integers(-1, 6), JUNK),
    dtype=st.one_of(st.sampled_from([torch.int16, torch.uint8, torch.int8, torch.float32]), JUNK),
    junk=st.one_of(st.none(), JUNK),
)
def test_batch_helpers(
    items: list[Any], prompt_length: Any, response_length: Any, dtype: Any, junk: Any
) -> None:
    ok, batch = settles(rr_vllm.validate_samples, items, META)
    settles(rr_vllm.validate_samples, [*items, junk] if junk is not None else items, junk)
    if not ok:
        return
    assert batch.num_sequences == len(items)
    prompts = [s.num_prompt_tokens if s is not None else 0 for s in items]
    ok, layout = settles(
        rr_vllm.to_trainer_layout,
        batch,
        prompts,
        prompt_length=prompt_length,
        response_length=response_length,
        dtype=dtype,
    )
    if ok:
        for b, sample in enumerate(items):
            if sample is None:
                continue
            P = sample.num_prompt_tokens
            got = layout.routes_BSLK[
                b, prompt_length - P : prompt_length + sample.routes_TLK.shape[0] - P
            ]
            want = torch.from_numpy(sample.routes_TLK * sample.valid_T[:, None, None])
            assert torch.equal(got.to(torch.int64), want.to(torch.int64))


@SWEEP
@given(
    ps=st.one_of(st.integers(-2, 8), JUNK),
    cached=st.one_of(st.none(), st.integers(-2, 8), JUNK),
    P=st.one_of(st.integers(-1, 8), JUNK),
)
def test_prompt_start_helpers(ps: Any, cached: Any, P: Any) -> None:
    ok, start = settles(rr_vllm.omission_start, ps, cached)
    if ok:
        assert start == max(ps, cached or 0)
    flags = rr_vllm.vllm_flags("0.30.0")
    ok, sent = settles(rr_vllm.prompt_start_to_send, ps, P, flags)
    if ok:
        assert 0 <= sent <= P


#: The entry points the sweeps above drive with generated answers and check for their invariant.
SWEPT_ABOVE = (
    "DecodeOptions", "decode_routes_array", "decode_vllm_output",
    "npy_base64_to_array", "sglang_base64_to_array", "decode_sglang", "merge_split_routes",
    "validate_samples", "to_trainer_layout", "truncate_sample", "drop_rows_before",
    "omission_start", "prompt_start_to_send", "vllm_flags",
)  # fmt: skip
#: Entry points whose invariant on arguments of any kind is "a result or an rr error": each
#: parameter drawn from rr_fakes.sweeps.ANYTHING, or a valid value of its kind.
SWEPT_WITH_JUNK = (
    "DecodedRoutes", "EngineConfig", "ModelGeometry", "R3v1Header", "SglangFlags", "Trajectory",
    "VerlRoutes", "VllmFlags", "assemble_multi_turn", "assemble_resumed", "check_engine_config",
    "check_verl_replayable", "concat_verl_routes", "decode_r3v1", "decode_sglang_openai",
    "decode_sglang_stream", "decode_trtllm_output", "decode_trtllm_routes", "decode_vllm_http",
    "decode_vllm_stream", "explain_store_errors", "flatten_completions", "is_store_eviction",
    "max_new_tokens", "moe_layer_numbers", "pack_batch_for_verl", "pack_for_verl",
    "read_r3v1_header", "route_meta_of", "routes_store_max_bytes", "sglang_engine_config",
    "sglang_flags", "sglang_request_fields",
    "to_verl_nested", "to_verl_padded", "truncate_response", "unreplayable_rows",
    "vllm_engine_args", "vllm_engine_config", "vllm_sampling_fields", "installed_vllm_version",
)  # fmt: skip
#: Public names that take no outside data.
NOT_ENTRY_POINTS = {
    "AbortPolicy": "a typing alias of on_abort's values",
    "DecodeKeywords": "a TypedDict: the deprecated keywords of the decoders (test_vllm_decoded)",
    "decode_vllm_batch": "deprecated: decode_vllm_output(...).to_batch(), swept above",
    "SampleRoutes": "what the decoders return (built by them, read by the helpers swept here)",
    "TrainerLayout": "a NamedTuple to_trainer_layout returns",
    "CaptureError": "an error class",
    "DecodeOptionsError": "an error class",
    "EngineOutputError": "an error class",
    "RouteStoreEvictedError": "an error class",
}
#: Valid values of the parameters most entry points share, drawn beside the junk so the checks
#: past the first one are reached too.
VALID = {
    "meta": st.one_of(st.just(META), ANYTHING),
    "options": st.one_of(st.just(OPTIONS), ANYTHING),
    # the deprecated names of the facts are held to their new names by test_vllm_decoded
    "prompt_token_ids": st.none(),
    "prompt_tokens": st.none(),
    "completion_tokens": st.none(),
    "sample": st.one_of(samples(), ANYTHING),
    "last_turn": st.one_of(samples(), ANYTHING),
    "samples": st.one_of(st.lists(samples(), max_size=2), ANYTHING),
    "attempts": st.one_of(st.lists(st.one_of(st.none(), samples()), max_size=2), ANYTHING),
    "num_prompt_tokens": st.one_of(st.integers(-1, 6), ANYTHING),
    "num_generated_tokens": st.one_of(st.integers(-1, 6), ANYTHING),
    "config": st.one_of(
        st.fixed_dictionaries(
            {"num_hidden_layers": st.integers(0, 4), "num_experts": st.integers(0, 9)},
            optional={
                "num_experts_per_tok": st.integers(0, 3),
                "mlp_only_layers": st.one_of(st.lists(st.integers(-1, 4)), ANYTHING),
                "first_k_dense_replace": st.one_of(st.integers(-1, 4), ANYTHING),
                "decoder_sparse_step": st.one_of(st.integers(0, 3), ANYTHING),
            },
        ),
        ANYTHING,
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rr_vllm,
    swept_above=SWEPT_ABOVE,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_ENTRY_POINTS,
    **VALID,
)


def test_validation_options_are_checked_before_the_ids() -> None:
    """Found by the junk sweep: a dict or an array as logical_experts reached a numpy compare."""
    sample = rr_vllm.decode_routes_array(
        routes(3, 0), DecodeOptions(meta=META), num_prompt_tokens=2, num_generated_tokens=2
    ).only()
    for bad in ({"a": 1}, np.zeros(0), "8", 0):
        with pytest.raises(rr_vllm.EngineOutputError, match="logical_experts must be an integer"):
            rr_vllm.validate_samples([sample], META, logical_experts=bad)
    with pytest.raises(rr_vllm.EngineOutputError, match="allow_physical must be True or False"):
        rr_vllm.validate_samples([sample], META, allow_physical="yes")  # type: ignore[arg-type]
