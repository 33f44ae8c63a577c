"""Every parser of outside data in rr_vllm, fed mutations of a valid input.

For any mutation the result is either what the mutated input means or an rr error: never another
exception, never different data. Byte mutations of a wire string can change the ids it carries,
so there the meaning is numpy's own reading of the bytes; structural mutations (a key removed, a
field of another type, a foreign object) never change what an answer means, so there the result
is the valid input's routes or an rr error.

Shapes: P prompt tokens, G generated tokens, N engine rows, L layer slots, K top-k.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rr_core import RouteBatch, RRError
from rr_fakes.emulations.engines import VllmEra, sglang_response, vllm_http_response
from rr_vllm import (
    EngineOutputError,
    VerlRoutes,
    decode_sglang,
    decode_vllm_batch,
    decode_vllm_http,
    decode_vllm_output,
    npy_base64_to_array,
    pack_for_verl,
    sglang_base64_to_array,
    to_verl_nested,
    to_verl_padded,
    unreplayable_rows,
    validate_samples,
)
from vllm_testing import META, distinct_routes, fake_vllm_output

P, G, L, K = 5, 4, 4, 2
ROUTES = distinct_routes(META, P + G - 1)
EXAMPLES = 300
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def outcome(parse: Callable[[], Any]) -> Any:
    """The parse's result, or the RRError it raised; any other exception fails the test."""
    try:
        result = parse()
    except RRError as e:
        event(f"raised {type(e).__name__}")
        return e
    event("decoded")
    return result


def same_batch(a: RouteBatch, b: RouteBatch) -> bool:
    return (
        torch.equal(a.values_NLK.long(), b.values_NLK.long())
        and torch.equal(a.valid_N, b.valid_N)
        and torch.equal(a.offsets_B1, b.offsets_B1)
    )


# --- .npy base64 (vLLM HTTP) -------------------------------------------------------------------


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


VALID_NPY = npy_bytes(ROUTES.astype(np.int32))
HEADER_END = VALID_NPY.index(b"\n") + 1


def npy_meaning(raw: bytes) -> np.ndarray | None:
    """numpy's reading of ``raw`` when it is an integer 3-D ``.npy`` array of exactly its
    declared size (the size is checked first, so a huge shape never reaches ``np.load``)."""
    fp = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(fp)
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(version)
        read = read or {(2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            return None
        shape, _, dtype = read(fp)
    except Exception:
        return None
    if dtype.kind not in "iu" or len(shape) != 3 or min(shape) < 0:
        return None
    if math.prod(shape) * dtype.itemsize != len(raw) - fp.tell():
        return None
    array: np.ndarray = np.load(io.BytesIO(raw), allow_pickle=False)
    return array


def header(descr: str, fortran: bool, shape: tuple[int, ...]) -> bytes:
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    text += " " * (-(len(text) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")


DESCRS = ["<i4", ">i4", "<u4", "<i8", "|u1", "<i2", "<f4", "|b1", "|O", "<U2", "<c8", "|V4"]
SHAPES = st.one_of(
    st.just((P + G - 1, L, K)),
    st.tuples(*[st.integers(-3, 40)] * 3),
    st.lists(st.integers(0, 10**18), min_size=0, max_size=5).map(tuple),
)


@st.composite
def npy_mutants(draw: st.DrawFn) -> bytes:
    raw = bytearray(VALID_NPY)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "delete", "header", "pad"]))
        if kind == "header":
            body = raw[HEADER_END:]
            raw = bytearray(
                header(draw(st.sampled_from(DESCRS)), draw(st.booleans()), draw(SHAPES)) + body
            )
            continue
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        if kind == "flip":
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 8))]
        else:
            raw += draw(st.binary(min_size=1, max_size=16))
    return bytes(raw)


@SETTINGS
@given(npy_mutants())
def test_npy_mutations_are_numpys_reading_or_an_rr_error(raw: bytes) -> None:
    got = outcome(lambda: npy_base64_to_array(base64.b64encode(raw).decode()))
    want = npy_meaning(raw)
    if want is None or want.ndim != 3:
        assert isinstance(got, EngineOutputError), got
    else:
        assert isinstance(got, np.ndarray), got
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@SETTINGS
@given(st.data())
def test_npy_text_mutations_are_the_decoded_bytes_or_an_rr_error(data: st.DataObject) -> None:
    text = list(base64.b64encode(VALID_NPY).decode())
    at = data.draw(st.integers(0, len(text) - 1))
    kind = data.draw(st.sampled_from(["replace", "insert", "cut", "non-ascii"]))
    char = data.draw(st.characters(codec="ascii") if kind != "non-ascii" else st.just("é"))
    if kind == "cut":
        del text[at:]
    elif kind == "insert":
        text.insert(at, char)
    else:
        text[at] = char
    mutated = "".join(text)
    got = outcome(lambda: npy_base64_to_array(mutated))
    try:
        want = npy_meaning(base64.b64decode(mutated, validate=True))
    except (binascii.Error, ValueError):
        want = None
    if want is None:
        assert isinstance(got, EngineOutputError), got
    else:
        np.testing.assert_array_equal(got, want)


def test_a_header_declaring_exabytes_is_refused_before_any_allocation() -> None:
    raw = header("<i4", False, (10**18, 3, 2)) + b"\0" * 24
    with pytest.raises(EngineOutputError, match=r"declares shape \(1000000000000000000, 3, 2\)"):
        npy_base64_to_array(base64.b64encode(raw).decode())


@pytest.mark.parametrize("cut", [1, 8, len(VALID_NPY) - HEADER_END, len(VALID_NPY) - 4])
def test_a_truncated_npy_names_the_declared_and_found_sizes(cut: int) -> None:
    with pytest.raises(EngineOutputError, match="truncated or altered"):
        npy_base64_to_array(base64.b64encode(VALID_NPY[:-cut]).decode())


def test_trailing_bytes_after_the_array_are_refused() -> None:
    with pytest.raises(EngineOutputError, match="bytes follow it"):
        npy_base64_to_array(base64.b64encode(VALID_NPY + b"\0" * 4).decode())


# --- SGLang base64 ----------------------------------------------------------------------------

VALID_SGLANG = ROUTES.astype("<i4").tobytes()


@SETTINGS
@given(st.data())
def test_sglang_mutations_are_the_bytes_read_as_int32_or_an_rr_error(data: st.DataObject) -> None:
    raw = bytearray(VALID_SGLANG)
    kind = data.draw(st.sampled_from(["cut", "extend", "flip", "text"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    text = None
    if kind == "cut":
        del raw[at:]
    elif kind == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=64))
    elif kind == "flip":
        raw[at] ^= 0xFF
    else:
        chars = list(base64.b64encode(raw).decode())
        chars[at % len(chars)] = data.draw(st.characters(codec="utf-8"))
        text = "".join(chars)
    text = base64.b64encode(raw).decode() if text is None else text
    got = outcome(lambda: sglang_base64_to_array(text, L, K))
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        decoded = None
    if decoded is None or len(decoded) % (4 * L * K):
        assert isinstance(got, EngineOutputError), got
    else:
        want = np.frombuffer(decoded, "<i4").reshape(-1, L, K)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("text", [None, 12, b"\xff\xfe", "A", "@@@@", "é"])
def test_malformed_sglang_strings_are_engine_output_errors(text: Any) -> None:
    with pytest.raises(EngineOutputError):
        sglang_base64_to_array(text, L, K)


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
HTTP_BATCH = validate_samples(decode_vllm_http(VALID_HTTP, META), META)


@SETTINGS
@given(structural_mutants(VALID_HTTP))
def test_http_answers_decode_to_their_routes_or_an_rr_error(response: Any) -> None:
    got = outcome(lambda: validate_samples(decode_vllm_http(response, META), META))
    assert isinstance(got, RRError) or same_batch(got, HTTP_BATCH), got


VALID_SGLANG_ANSWER = sglang_response(
    prompt_ids=list(range(P)),
    generated_ids=list(range(G)),
    routes_TLK=ROUTES,
    num_experts=META.num_experts,
)
SGLANG_BATCH = validate_samples([decode_sglang(VALID_SGLANG_ANSWER, META)], META)


@SETTINGS
@given(structural_mutants(VALID_SGLANG_ANSWER))
def test_sglang_answers_decode_to_their_routes_or_an_rr_error(response: Any) -> None:
    got = outcome(lambda: validate_samples([decode_sglang(response, META)], META))
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
        decode_vllm_http(response, META)


def test_a_choice_without_routes_is_d3() -> None:
    response = copy.deepcopy(VALID_HTTP)
    del response["choices"][0]["routed_experts"]
    with pytest.raises(EngineOutputError, match="D3"):
        decode_vllm_http(response, META)


@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
@pytest.mark.parametrize("value", ["5", 5.0, 5.7, None, True, -1, [5]])
def test_sglang_token_counts_must_be_integers(field: str, value: Any) -> None:
    response = copy.deepcopy(VALID_SGLANG_ANSWER)
    response["meta_info"][field] = value
    with pytest.raises(EngineOutputError, match=f"{field} must be an integer >= 0"):
        decode_sglang(response, META)


@pytest.mark.parametrize("field", ["prompt_tokens", "meta_info"])
def test_sglang_missing_fields_are_named(field: str) -> None:
    response = copy.deepcopy(VALID_SGLANG_ANSWER)
    if field == "meta_info":
        response = response["meta_info"]
        response.pop("prompt_tokens")
    else:
        del response["meta_info"][field]
    with pytest.raises(EngineOutputError, match="has no 'prompt_tokens'"):
        decode_sglang(response, META)


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
    era: decode_vllm_batch([vllm_output(era)], META)
    for era in [VllmEra.V0_14, VllmEra.V0_21, VllmEra.V0_22, VllmEra.V0_32]
}


@SETTINGS
@given(engine_mutants())
def test_engine_objects_decode_to_their_routes_or_an_rr_error(out: Any) -> None:
    want = ENGINE_BATCH[VllmEra.V0_22]  # every era's valid output means the same routes
    by_sample = outcome(lambda: validate_samples(decode_vllm_output(out, META), META))
    assert isinstance(by_sample, RRError) or same_batch(by_sample, want), by_sample
    batched = outcome(lambda: decode_vllm_batch([out], META))
    assert isinstance(batched, RRError) or same_batch(batched, want), batched


def test_every_era_means_the_same_routes() -> None:
    batches = list(ENGINE_BATCH.values())
    assert all(same_batch(b, batches[0]) for b in batches)


@pytest.mark.parametrize("value", [None, 7, "outputs", {"0": 1}])
def test_foreign_outputs_are_engine_output_errors(value: Any) -> None:
    out = vllm_output()
    out.outputs = value
    with pytest.raises(EngineOutputError):
        decode_vllm_output(out, META)
    with pytest.raises(EngineOutputError):
        decode_vllm_batch([out], META)


def test_an_object_without_request_fields_names_them() -> None:
    with pytest.raises(EngineOutputError, match="has no attribute 'prompt_token_ids'"):
        decode_vllm_output(object(), META)
    with pytest.raises(EngineOutputError, match="list of RequestOutput"):
        decode_vllm_batch(vllm_output(), META)


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

    routes = pack_for_verl(decode_vllm_output(vllm_output(), META), META, codec=codec)
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
            decode_vllm_http(VALID_HTTP, META, vllm_version=version)
