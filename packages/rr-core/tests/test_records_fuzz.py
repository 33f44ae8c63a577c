"""Property: for any mutation of a valid record file, the reader returns exactly what the file
encodes or raises an RRError; never another exception, never different routes.

Mutations without a recomputed checksum (bit flips, truncation, appended bytes) must give the
original routes or an error. Mutations with a recomputed checksum (metadata values, tensors,
safetensors header entries), as a buggy or foreign writer would make them, may describe other
routes: then what comes back must re-encode to exactly the file's tensors and metadata.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load

from rr_core import RouteBatch
from rr_core.cli import main as _cli
from rr_core.codecs.encoding import encode_routes
from rr_core.errors import RRError
from rr_core.records.check import KEYS
from rr_core.records.file import _checksum, load_routes, read_header, save_routes

from rr_core_testing import random_batch

EXAMPLES = 150  # per test and run; five tests
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_DIR = Path(tempfile.mkdtemp(prefix="rr-fuzz-"))


def _originals() -> list[tuple[bytes, RouteBatch]]:
    rng = np.random.default_rng(7)
    cases = [
        (random_batch(rng, 60, 4, lengths=[5, 0, 6], layers=3, dense=(2,)), "packed"),
        (random_batch(rng, 300, 2, lengths=[4, 3], layers=2), "raw"),
        (random_batch(rng, 16, 3, lengths=[9], layers=2, valid_share=0.5), "set"),
    ]
    out = []
    for i, (batch, codec) in enumerate(cases):
        path = save_routes(
            _DIR / f"orig{i}.rr",
            batch,
            codec=codec,
            sample_ids=["a", 7, "c"][: batch.num_sequences],
        )
        out.append((path.read_bytes(), load_routes(path)))
    return out


ORIGINALS = _originals()
_counter = iter(range(1 << 62))


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + body


def _resum(data: bytes) -> bytes:
    """``data`` with its checksum recomputed, where safetensors can still load it."""
    header, body = _split(data)
    md = header.get("__metadata__")
    try:
        tensors = load(data)
        if not isinstance(md, dict) or sorted(tensors) != ["offsets", "payload", "valid_bits"]:
            return data
        md["checksum"] = _checksum(md, tensors)
    except Exception:  # unloadable: the reader must refuse it anyway
        return data
    return _join(header, body)


def _check(data: bytes, original: RouteBatch, *, resummed: bool) -> None:
    path = _DIR / f"m{next(_counter)}.rr"
    path.write_bytes(data)
    try:
        assert _cli.main(["verify", "--allow-all-zero", str(path)]) in (0, 1)
        with contextlib.suppress(RRError):
            read_header(path)
        try:
            got = load_routes(path)
        except RRError:
            return
        if not resummed:
            assert got.equal(original)
            return
        _assert_faithful(got, data)
    finally:
        path.unlink()


def _assert_faithful(got: RouteBatch, data: bytes) -> None:
    """``got`` re-encodes to exactly the file's tensors and metadata."""
    header, _ = _split(data)
    md, tensors = header["__metadata__"], load(data)
    enc = encode_routes(got, md["codec"])
    for name, mine in (
        ("payload", enc.payload),
        ("valid_bits", enc.valid_bits),
        ("offsets", enc.offsets_B1),
    ):
        theirs = tensors[name]
        assert mine.dtype == theirs.dtype, name
        assert torch.equal(mine, theirs), name
    m = got.meta
    assert md["num_rows"] == str(got.num_tokens)
    assert md["num_experts"] == str(m.num_experts)
    assert md["top_k"] == str(m.top_k)
    assert md["layer_axis"] == m.layer_axis
    layers = json.loads(md["layer_numbers"])
    assert [type(v) for v in layers] == [int] * len(layers)
    assert tuple(layers) == m.layer_numbers
    moe = json.loads(md["moe_layer_numbers"])
    assert (tuple(layers) if moe is None else tuple(moe)) == m.routed_layer_numbers
    assert len(json.loads(md["sample_ids"])) == got.num_sequences


originals = st.sampled_from(range(len(ORIGINALS)))


@_SETTINGS
@given(
    originals,
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 7)), min_size=1, max_size=4),
)
def test_bit_flips(which: int, flips: list[tuple[int, int]]) -> None:
    data, original = ORIGINALS[which]
    mutated = bytearray(data)
    for pos, bit in flips:
        mutated[pos % len(data)] ^= 1 << bit
    _check(bytes(mutated), original, resummed=False)


@_SETTINGS
@given(originals, st.integers(0, 1 << 20), st.binary(max_size=64))
def test_truncation_and_appended_bytes(which: int, cut: int, extra: bytes) -> None:
    data, original = ORIGINALS[which]
    _check(data[: cut % len(data)], original, resummed=False)
    if extra:
        _check(data + extra, original, resummed=False)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 400)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_values = st.one_of(
    st.text(max_size=12),
    st.integers(-3, 1 << 40).map(str),
    _json_values.map(json.dumps),
    st.lists(st.integers(0, 12), max_size=6).map(json.dumps),
    st.lists(st.integers(0, 5) | st.text("abc7", max_size=2), max_size=5).map(json.dumps),
    st.sampled_from(["raw", "packed", "set", "all_layers", "moe_layers", "null", "0", "1", "016"]),
)


@_SETTINGS
@given(
    originals,
    st.lists(
        st.tuples(st.sampled_from([*KEYS, "extra"]), st.none() | _values), min_size=1, max_size=3
    ),
)
def test_metadata_edits_with_a_recomputed_checksum(
    which: int, edits: list[tuple[str, str | None]]
) -> None:
    data, original = ORIGINALS[which]
    header, body = _split(data)
    md = header["__metadata__"]
    for key, value in edits:
        if value is None:
            md.pop(key, None)
        else:
            md[key] = value
    _check(_resum(_join(header, body)), original, resummed=True)


_DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float32,
    torch.bfloat16,
]


def _tensor_edit(draw: st.DrawFn, t: torch.Tensor) -> torch.Tensor:
    kind = draw(st.sampled_from(["dtype", "cut", "grow", "random", "shape", "values", "or"]))
    if kind == "or" and t.numel():  # bits set in the last element: in valid_bits, past the rows
        values = t.clone()
        values[-1] |= draw(st.integers(0, 7).map(lambda b: 1 << b) | st.integers(0, 255))
        return values
    if kind == "dtype":
        return t.to(draw(st.sampled_from(_DTYPES)))
    if kind == "cut":
        return t[: draw(st.integers(0, max(0, t.numel() - 1)))]
    if kind == "grow":
        return torch.cat(
            [t, t.new_tensor(draw(st.lists(st.integers(0, 255), min_size=1, max_size=9)))]
        )
    if kind == "random":
        n = draw(st.integers(0, t.numel() + 3))
        return torch.tensor(
            draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)), dtype=t.dtype
        )
    if kind == "shape":
        return t.reshape(1, -1) if draw(st.booleans()) or t.numel() == 0 else t[:1].reshape(())
    values = t.clone()
    if t.numel():
        i = draw(st.integers(0, t.numel() - 1))
        lo, hi = (-3, 20) if t.dtype == torch.int64 else (0, 255)
        values[i] = draw(st.integers(lo, hi))
    return values


@_SETTINGS
@given(originals, st.data())
def test_tensor_edits_with_a_recomputed_checksum(which: int, data_: st.DataObject) -> None:
    from safetensors.torch import save

    data, original = ORIGINALS[which]
    header, _ = _split(data)
    md, tensors = header["__metadata__"], dict(load(data))
    names = data_.draw(
        st.lists(st.sampled_from(sorted(tensors)), min_size=1, max_size=2, unique=True)
    )
    for name in names:
        tensors[name] = _tensor_edit(data_.draw, tensors[name]).contiguous()
    if data_.draw(st.booleans()):  # and, sometimes, a metadata value that might now agree
        key = data_.draw(st.sampled_from(["num_rows", "sample_ids", "num_experts"]))
        md[key] = data_.draw(_values)
    md["checksum"] = _checksum(md, tensors)
    _check(save(tensors, metadata=md), original, resummed=True)


_ST_DTYPES = [
    "U8",
    "I8",
    "I16",
    "I32",
    "I64",
    "BOOL",
    "F16",
    "BF16",
    "F32",
    "F64",
    "U16",
    "F8_E4M3",
]


@_SETTINGS
@given(
    originals,
    st.sampled_from(["payload", "valid_bits", "offsets", "__metadata__"]),
    st.sampled_from(["dtype", "shape", "data_offsets", "drop", "junk"]),
    st.data(),
)
def test_header_entry_edits(which: int, name: str, field: str, data_: st.DataObject) -> None:
    data, original = ORIGINALS[which]
    header, body = _split(data)
    if field == "drop":
        header.pop(name)
    elif field == "junk":
        header[name] = data_.draw(_json_values)
    elif name != "__metadata__":
        entry = header[name]
        if field == "dtype":
            entry["dtype"] = data_.draw(st.sampled_from(_ST_DTYPES))
        elif field == "shape":
            entry["shape"] = data_.draw(st.lists(st.integers(0, 40), max_size=3))
        else:
            entry["data_offsets"] = data_.draw(
                st.lists(st.integers(0, len(body) + 8), min_size=2, max_size=2)
            )
    _check(_resum(_join(header, body)), original, resummed=True)
