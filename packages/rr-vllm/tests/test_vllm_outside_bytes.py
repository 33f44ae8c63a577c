"""The wire strings of rr_vllm's outside data (vLLM's base64 ``.npy``, SGLang's base64 int32
rows), fed mutations of a valid string: the result is numpy's own reading of the mutated bytes
or an rr error, never another exception, never other data.

Shapes: N engine rows, L layer slots, K top-k.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rr_vllm import EngineOutputError, npy_base64_to_array, sglang_base64_to_array
from vllm_testing import META, SETTINGS, distinct_routes, outcome

P, G, L, K = 5, 4, 4, 2
ROUTES = distinct_routes(META, P + G - 1)


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
