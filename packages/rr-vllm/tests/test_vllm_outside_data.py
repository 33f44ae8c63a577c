"""Every parser of outside data in rr_vllm, fed mutations of a valid input: the structured answers
(JSON, engine objects, verl payloads; the wire strings are test_vllm_outside_bytes').

For any mutation the result is either what the mutated input means or an rr error: never another
exception, never different data. Structural mutations (a key removed, a field of another type, a
foreign object) never change what an answer means, so the result is the valid input's routes or
an rr error.

Shapes: P prompt tokens, G generated tokens, N engine rows, L layer slots, K top-k.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rr_core import RouteBatch, RRError
from rr_fakes.emulations.engines import VllmEra, sglang_response, vllm_http_response
from rr_vllm import (
    DecodeOptions,
    EngineOutputError,
    VerlRoutes,
    decode_sglang,
    decode_vllm_http,
    decode_vllm_output,
    pack_for_verl,
    to_verl_nested,
    to_verl_padded,
    unreplayable_rows,
    validate_samples,
)
from vllm_testing import META, SETTINGS, distinct_routes, fake_vllm_output, outcome

P, G, L, K = 5, 4, 4, 2
ROUTES = distinct_routes(META, P + G - 1)


def same_batch(a: RouteBatch, b: RouteBatch) -> bool:
    return (
        torch.equal(a.values_NLK.long(), b.values_NLK.long())
        and torch.equal(a.valid_N, b.valid_N)
        and torch.equal(a.offsets_B1, b.offsets_B1)
    )


# --- JSON answers (vLLM HTTP, SGLang) ---------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats()
    | st.text(max_size=6).filter(lambda s: s != "abort"),  # "abort" means: masked
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)


def kind_of(value: Any) -> type:
    """The JSON kind of a value: lists and tuples are one kind (both are token-id lists)."""
    return list if isinstance(value, list | tuple) else type(value)


class _OtherType:
    def __init__(self, old: Any) -> None:
        self.kind = kind_of(old)

    def __call__(self, value: Any) -> bool:
        return kind_of(value) is not self.kind

    def __repr__(self) -> str:
        return f"not a {self.kind.__name__}"


def other_type(old: Any) -> st.SearchStrategy[Any]:
    """A JSON value of another type than ``old``."""
    return JSON_VALUES.filter(_OtherType(old))


def paths(tree: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += paths(v, (*at, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree[:6]):  # a few token ids stand for all of them
            out += paths(v, (*at, i))
    return out


def get(tree: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def original(valid: Any, path: tuple[Any, ...], now: Any) -> Any:
    """The valid answer's value at ``path`` (a second mutation of a field must still differ in
    kind from the valid value), or ``now`` where the valid answer has no such path."""
    try:
        return get(valid, path)
    except (KeyError, IndexError, TypeError):
        return now


@st.composite
def structural_mutants(draw: st.DrawFn, valid: dict[str, Any]) -> Any:
    """``valid`` with 1-3 structural mutations: a key removed or added, a value replaced by one
    of another type, a value wrapped in a list; never a same-typed value (that could be a
    different, valid answer)."""
    tree: Any = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(tree)))
        old = get(tree, path)
        was = original(valid, path, old)
        kind = draw(st.sampled_from(["delete", "replace", "wrap", "add"]))
        if kind == "add" and isinstance(old, dict):
            # a new key: an error marker, or a name no answer uses (never one deleted before)
            name = draw(st.sampled_from(["error", "object"]) | st.text(max_size=6).map("~".__add__))
            if name not in old and not (isinstance(was, dict) and name in was):
                old[name] = draw(JSON_VALUES)
            continue
        if kind == "wrap" and kind_of(old) is not list and kind_of(was) is not list:
            new: Any = [old]
        else:
            new = draw(other_type(was))
        if not path:
            tree = new
        elif kind == "delete" and isinstance(get(tree, path[:-1]), dict):
            del get(tree, path[:-1])[path[-1]]
        else:
            get(tree, path[:-1])[path[-1]] = new
    return tree


def vllm_output(era: VllmEra = VllmEra.V0_22) -> Any:
    return fake_vllm_output(era, META, ROUTES, P, G)


VALID_HTTP = vllm_http_response(vllm_output())
HTTP_BATCH = validate_samples(decode_vllm_http(VALID_HTTP, DecodeOptions(meta=META)), META)


@SETTINGS
@given(structural_mutants(VALID_HTTP))
def test_http_answers_decode_to_their_routes_or_an_rr_error(response: Any) -> None:
    got = outcome(
        lambda: validate_samples(decode_vllm_http(response, DecodeOptions(meta=META)), META)
    )
    assert isinstance(got, RRError) or same_batch(got, HTTP_BATCH), got


VALID_SGLANG_ANSWER = sglang_response(
    prompt_ids=list(range(P)),
    generated_ids=list(range(G)),
    routes_TLK=ROUTES,
    num_experts=META.num_experts,
)
SGLANG_BATCH = validate_samples(
    [decode_sglang(VALID_SGLANG_ANSWER, DecodeOptions(meta=META)).only()], META
)


@SETTINGS
@given(structural_mutants(VALID_SGLANG_ANSWER))
def test_sglang_answers_decode_to_their_routes_or_an_rr_error(response: Any) -> None:
    got = outcome(
        lambda: validate_samples([decode_sglang(response, DecodeOptions(meta=META)).only()], META)
    )
    assert isinstance(got, RRError) or same_batch(got, SGLANG_BATCH), got


@pytest.mark.parametrize(
    ("response", "match"),
    [
        ({"id": "cmpl-1", "object": "text_completion"}, "has no 'choices'"),
        ({"choices": "abc"}, "'choices' must be a list"),
        ({"choices": []}, "'choices' is empty"),
        ({"choices": [7]}, "choice 0 must be a JSON object"),
        ([{"choices": []}], "must be a JSON object"),
        ("{}", "must be a JSON object"),
    ],
)
def test_malformed_http_answers_name_what_was_expected(response: Any, match: str) -> None:
    with pytest.raises(EngineOutputError, match=match):
        decode_vllm_http(response, DecodeOptions(meta=META))


def test_a_choice_without_routes_is_d3() -> None:
    response = copy.deepcopy(VALID_HTTP)
    del response["choices"][0]["routed_experts"]
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_http(response, DecodeOptions(meta=META))


@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
@pytest.mark.parametrize("value", ["5", 5.0, 5.7, None, True, -1, [5]])
def test_sglang_token_counts_must_be_integers(field: str, value: Any) -> None:
    response = copy.deepcopy(VALID_SGLANG_ANSWER)
    response["meta_info"][field] = value
    with pytest.raises(EngineOutputError, match=f"{field} must be an integer >= 0"):
        decode_sglang(response, DecodeOptions(meta=META)).only()


@pytest.mark.parametrize("field", ["prompt_tokens", "meta_info"])
def test_sglang_missing_fields_are_named(field: str) -> None:
    response = copy.deepcopy(VALID_SGLANG_ANSWER)
    if field == "meta_info":
        response = response["meta_info"]
        response.pop("prompt_tokens")
    else:
        del response["meta_info"][field]
    with pytest.raises(EngineOutputError, match="has no 'prompt_tokens'"):
        decode_sglang(response, DecodeOptions(meta=META)).only()


# --- engine objects (vLLM RequestOutput / CompletionOutput) ------------------------------------

ARRAY_FORMS: dict[str, Callable[[np.ndarray], Any]] = {
    **{
        f"astype {d}": functools.partial(np.ndarray.astype, dtype=d)
        for d in ["int8", "uint8", "int16", "uint16", "int64", "uint64", ">i4", "float32", "bool"]
    },
    "object": lambda a: a.astype(object),
    "complex": lambda a: a.astype(np.complex64),
    "torch": lambda a: torch.from_numpy(np.ascontiguousarray(a)),
    "torch uint8": lambda a: torch.from_numpy(a.astype(np.uint8)),
    "torch float": lambda a: torch.from_numpy(a.astype(np.float32)),
    "torch bf16": lambda a: torch.from_numpy(a.astype(np.float32)).bfloat16(),
    "torch bool": lambda a: torch.from_numpy(a != 0),
    "list": lambda a: a.tolist(),
    "ragged list": lambda a: [*a.tolist(), [[0]]],
    "fortran": np.asfortranarray,
    "2-D": lambda a: a.reshape(a.shape[0], -1),
    "4-D": lambda a: a[None],
    "rows cut": lambda a: a[:-1],
    "layers swapped with top_k": lambda a: a.transpose(0, 2, 1),
    "0-d": lambda a: np.array(5),
    "string": lambda a: a.astype(str),
}


@st.composite
def engine_mutants(draw: st.DrawFn) -> Any:
    era = draw(st.sampled_from([VllmEra.V0_14, VllmEra.V0_21, VllmEra.V0_22, VllmEra.V0_32]))
    out = vllm_output(era)
    completion = out.outputs[0]
    valid = {id(out): dict(vars(out)), id(completion): dict(vars(completion))}
    for _ in range(draw(st.integers(1, 3))):
        obj = draw(st.sampled_from([out, completion]))
        name = draw(st.sampled_from(sorted(valid[id(obj)])))
        old = valid[id(obj)][name]  # a second mutation of a field still differs from the valid
        kind = draw(st.sampled_from(["array", "replace", "delete"]))
        if kind == "array" and isinstance(old, np.ndarray):
            setattr(obj, name, ARRAY_FORMS[draw(st.sampled_from(sorted(ARRAY_FORMS)))](old))
        elif kind == "delete":
            if name in vars(obj):  # a dataclass field with a default falls back to it
                delattr(obj, name)
        else:
            setattr(obj, name, draw(other_type(old)))
    return out


ENGINE_BATCH = {
    era: decode_vllm_output([vllm_output(era)], DecodeOptions(meta=META)).to_batch()
    for era in [VllmEra.V0_14, VllmEra.V0_21, VllmEra.V0_22, VllmEra.V0_32]
}


@SETTINGS
@given(engine_mutants())
def test_engine_objects_decode_to_their_routes_or_an_rr_error(out: Any) -> None:
    want = ENGINE_BATCH[VllmEra.V0_22]  # every era's valid output means the same routes
    by_sample = outcome(
        lambda: validate_samples(decode_vllm_output(out, DecodeOptions(meta=META)), META)
    )
    assert isinstance(by_sample, RRError) or same_batch(by_sample, want), by_sample
    batched = outcome(lambda: decode_vllm_output([out], DecodeOptions(meta=META)).to_batch())
    assert isinstance(batched, RRError) or same_batch(batched, want), batched


def test_every_era_means_the_same_routes() -> None:
    batches = list(ENGINE_BATCH.values())
    assert all(same_batch(b, batches[0]) for b in batches)


@pytest.mark.parametrize("value", [None, 7, "outputs", {"0": 1}])
def test_foreign_outputs_are_engine_output_errors(value: Any) -> None:
    out = vllm_output()
    out.outputs = value
    with pytest.raises(EngineOutputError):
        list(decode_vllm_output(out, DecodeOptions(meta=META)))
    with pytest.raises(EngineOutputError):
        decode_vllm_output([out], DecodeOptions(meta=META)).to_batch()


def test_an_object_without_request_fields_names_them() -> None:
    with pytest.raises(EngineOutputError, match="a RequestOutput or a list of them; got object"):
        list(decode_vllm_output(object(), DecodeOptions(meta=META)))


# --- verl payloads (they travel through Ray) --------------------------------------------------

ENCODED_FORMS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "payload float": lambda e: {"payload": e.payload.float()},
    "payload int16": lambda e: {"payload": e.payload.to(torch.int16)},
    "payload short": lambda e: {"payload": e.payload[:-1]},
    "payload long": lambda e: {"payload": torch.cat([e.payload, e.payload[:1]])},
    "validity bits cut": lambda e: {"valid_bits": e.valid_bits[:0]},
    "validity bits bool": lambda e: {"valid_bits": e.valid_bits.bool()},
    "rows beyond the bits": lambda e: {"num_rows": e.num_rows + 8},
    "offsets past the rows": lambda e: {"offsets_B1": torch.tensor([0, 20])},
    "unknown codec": lambda e: {"codec": "zip"},
}


@pytest.mark.parametrize("codec", ["raw", "packed", "set"])
@pytest.mark.parametrize("form", sorted(ENCODED_FORMS))
def test_altered_verl_payloads_are_rr_errors(codec: str, form: str) -> None:
    import dataclasses

    routes = pack_for_verl(
        decode_vllm_output(vllm_output(), DecodeOptions(meta=META)), META, codec=codec
    )
    encoded = dataclasses.replace(routes.encoded, **ENCODED_FORMS[form](routes.encoded))

    def expand() -> None:
        altered = VerlRoutes(encoded=encoded, num_prompt_tokens=routes.num_prompt_tokens)
        unreplayable_rows(altered)
        to_verl_nested(altered, strict=False)
        to_verl_padded(altered, prompt_length=P, response_length=G, strict=False)

    with pytest.raises(RRError):
        expand()


@pytest.mark.parametrize("version", [5, 0.33, None, ["0.33.0"], b"0.33.0"])
def test_a_version_that_is_not_a_string_is_a_capture_error(version: Any) -> None:
    from rr_vllm import CaptureError, vllm_flags

    with pytest.raises(CaptureError, match="the vLLM version must be a string"):
        vllm_flags(version)
    if version is not None:  # None: the installed version
        with pytest.raises(CaptureError, match="the vLLM version must be a string"):
            decode_vllm_http(VALID_HTTP, DecodeOptions(meta=META, engine_version=version))
