"""Near-miss sweeps over rr_core's data-facing entry points: the plausible wrong data
users produce, not junk. Each call gives the right result or an RRError naming the argument:
payloads and route ids in another dtype, codec and axis names in other spellings, provenance as
JSON text, save_routes' arguments swapped, limits just past their maximum."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from rr_core import LayoutConfig, RouteBatch, RouteMeta, load_routes, save_routes
from rr_core.codecs.encoding import CODECS, decode_routes, encode_routes
from rr_core.layout.pipeline import MAX_LAYERS
from rr_fakes import distinct_ids
from rr_fakes.sweeps import (
    SWEEP,
    json_text,
    just_past,
    right_or_named,
    spellings,
    widened,
)

E, K = 8, 2
META = RouteMeta(num_experts=E, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2))
ROUTES = distinct_ids(6, 2, num_experts=E, top_k=K, seed=3).to(torch.uint8)
BATCH = RouteBatch(ROUTES, [0, 2, 6], None, META)


@SWEEP
@given(data=st.data(), codec=st.sampled_from(CODECS))
def test_a_payload_in_another_dtype_decodes_alike_or_is_named(
    data: st.DataObject, codec: str
) -> None:
    encoded = encode_routes(BATCH, codec)
    payload = data.draw(widened(encoded.payload))
    near = dataclasses.replace(encoded, payload=payload)
    right_or_named(
        lambda: decode_routes(near),
        "payload",
        right=lambda b: torch.equal(b.values_NLK.long(), decode_routes(encoded).values_NLK.long()),
    )


@SWEEP
@given(data=st.data())
def test_route_ids_in_another_dtype_give_the_same_batch_or_are_named(data: st.DataObject) -> None:
    values = data.draw(widened(ROUTES))
    right_or_named(
        lambda: RouteBatch(values, [0, 2, 6], None, META),
        "dtype",
        "integer",
        right=lambda b: torch.equal(b.values_NLK.long(), ROUTES.long()),
    )


@SWEEP
@given(codec=st.sampled_from(CODECS).flatmap(spellings))
def test_a_codec_in_another_spelling_is_the_codec_or_named(codec: str) -> None:
    right_or_named(
        lambda: encode_routes(BATCH, codec),
        "codec",
        right=lambda enc: decode_routes(enc).values_NLK.tolist() == ROUTES.tolist(),
    )


@SWEEP
@given(axis=st.sampled_from(["moe_layers", "all_layers"]).flatmap(spellings))
def test_a_layer_axis_in_another_spelling_is_the_axis_or_named(axis: str) -> None:
    right_or_named(
        lambda: RouteMeta(num_experts=E, top_k=K, layer_axis=axis, layer_numbers=(1, 2)),  # type: ignore[arg-type]
        "layer_axis",
        right=lambda meta: meta.layer_axis in ("moe_layers", "all_layers"),
    )


@SWEEP
@given(text=json_text({"engine": "vllm", "engine_version": "0.33.0"}))
def test_provenance_as_json_text_is_named(text: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.rr"
        right_or_named(
            lambda: save_routes(path, BATCH, provenance=text),
            "provenance",
            right=lambda p: load_routes(p).num_sequences == 2,
        )


def test_save_routes_arguments_swapped_are_named(tmp_path: Path) -> None:
    path = tmp_path / "r.rr"
    right_or_named(lambda: save_routes(BATCH, path), "routebatch", "path")  # type: ignore[arg-type]
    assert not path.exists()


@SWEEP
@given(count=just_past(2))
def test_sample_ids_past_the_sequence_count_are_named(count: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        right_or_named(
            lambda: save_routes(Path(d) / "r.rr", BATCH, sample_ids=list(range(count))),
            "sample_ids",
            "sequences",
        )


@SWEEP
@given(layers=just_past(MAX_LAYERS))
def test_a_layer_count_just_past_the_limit_is_named(layers: int) -> None:
    right_or_named(lambda: LayoutConfig(num_layers=layers), "num_layers")
