"""The config adapter against real megatron-core: for generated configs, rr-core's offsets and
per-stage counts equal Megatron's own ``get_transformer_layer_offset`` /
``get_num_layers_to_build`` on every (pp_rank, vp_stage), on every line.

Megatron's functions are called with the line's signature (``(config)`` on 0.12, ``+vp_stage``
from 0.13, ``+pp_rank`` from 0.15) and with the pipeline ranks also set in ``parallel_state``
through its setters, because 0.12 reads them from there and, on every line, the
``pipeline_model_parallel_layout`` path ignores a passed ``pp_rank`` and reads the global one.

Generation covers only configs Megatron accepts: a config whose ``TransformerConfig`` raises (for
example 0.12 dividing by zero middle stages when pp=2 sets both the first and the last stage) is
discarded. Virtual pipelining is generated only with pp >= 2: with pp=1 Megatron gives every
chunk all layers at offset 0, which is no split at all (rr-core refuses it).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from rr_core import (
    LayoutConfig,
    LayoutError,
    layer_offset,
    moe_pattern,
    num_layers_to_build,
)
from rr_core.layout.pipeline import virtual_stage_layer_counts
from rr_fakes.shims.megatron import unavailable_reason
from rr_megatron_compat._layout import layout_config, parse_moe_layer_freq

if (_REASON := unavailable_reason()) is not None:
    pytest.skip(_REASON, allow_module_level=True)

from rr_fakes.shims.megatron import megatron_cpu

LINE = Version(Version(importlib.metadata.version("megatron-core")).base_version)
HAS_LAYOUT = Version("0.13") <= LINE


@pytest.fixture(scope="module")
def mc() -> Iterator[dict[str, Any]]:
    """Megatron's modules, imported and used inside the CPU harness."""
    with megatron_cpu():
        names = {
            "ps": "megatron.core.parallel_state",
            "tc": "megatron.core.transformer.transformer_config",
            "layer": "megatron.core.transformer.transformer_layer",
            "block": "megatron.core.transformer.transformer_block",
            "specs": "megatron.core.models.gpt.gpt_layer_specs",
        }
        yield {key: importlib.import_module(name) for key, name in names.items()}


@contextlib.contextmanager
def pipeline_state(ps: Any, pp_size: int, vp_size: int | None) -> Iterator[None]:
    """Megatron's global pipeline sizes for the calls below; cleared afterwards."""
    ps.set_pipeline_model_parallel_world_size(pp_size)
    ps.set_virtual_pipeline_model_parallel_world_size(vp_size)
    try:
        yield
    finally:
        ps.set_pipeline_model_parallel_world_size(None)
        ps.set_virtual_pipeline_model_parallel_world_size(None)
        ps.set_pipeline_model_parallel_rank(None)
        ps.set_virtual_pipeline_model_parallel_rank(None)


def megatron_stage(
    mc: dict[str, Any], tc: Any, pp_rank: int, vp_stage: int | None
) -> tuple[int, int]:
    """(offset, layers to build) from Megatron's own functions for one stage."""
    ps = mc["ps"]
    ps.set_pipeline_model_parallel_rank(pp_rank)
    ps.set_virtual_pipeline_model_parallel_rank(vp_stage if vp_stage is not None else 0)
    kwargs: dict[str, Any] = {}
    if Version("0.13") <= LINE:
        kwargs["vp_stage"] = vp_stage
    if Version("0.15") <= LINE:
        kwargs["pp_rank"] = pp_rank
    offset = mc["layer"].get_transformer_layer_offset(tc, **kwargs)
    count = mc["block"].get_num_layers_to_build(tc, **kwargs)
    return int(offset), int(count)


def test_signature_history_matches_the_line(mc: dict[str, Any]) -> None:
    expected = ["config"]
    if Version("0.13") <= LINE:
        expected.append("vp_stage")
    if Version("0.15") <= LINE:
        expected.append("pp_rank")
    for fn in (mc["layer"].get_transformer_layer_offset, mc["block"].get_num_layers_to_build):
        assert list(inspect.signature(fn).parameters) == expected


# -- generated configs ----------------------------------------------------------------------------


@st.composite
def moe_freqs(draw: st.DrawFn, num_layers: int) -> Any:
    kind = draw(st.sampled_from(["int", "list", "str"]))
    if kind == "int":
        return draw(st.integers(1, 3))
    bits = draw(st.lists(st.integers(0, 1), min_size=num_layers, max_size=num_layers))
    return bits if kind == "list" else "+".join(f"[{b}]*1" for b in bits)


@st.composite
def split_configs(draw: st.DrawFn) -> dict[str, Any]:
    """TransformerConfig fields: an even split (optionally with embedding / loss in it), an
    uneven first / last stage, or (0.13+) an explicit pipeline layout."""
    kinds = ["even", "uneven"] + (["layout"] if HAS_LAYOUT else [])
    kind = draw(st.sampled_from(kinds))
    pp = draw(st.integers(1, 4) if kind == "even" else st.integers(2, 4))
    vp = draw(st.sampled_from([None, 2, 3])) if pp > 1 else None
    v = vp or 1
    fields: dict[str, Any] = {"pipeline_model_parallel_size": pp}
    if kind == "even":
        emb, loss = draw(st.booleans()) and pp > 1, draw(st.booleans()) and pp > 1
        num_layers = pp * v * draw(st.integers(1, 3)) - emb - loss
        assume(num_layers >= 1)
        fields |= {
            "account_for_embedding_in_pipeline_split": emb,
            "account_for_loss_in_pipeline_split": loss,
        }
    elif kind == "uneven":
        first = draw(st.one_of(st.none(), st.integers(1, 3).map(lambda a: a * v)))
        last = draw(st.one_of(st.none(), st.integers(1, 3).map(lambda b: b * v)))
        assume(first is not None or last is not None)
        middle = pp - (first is not None) - (last is not None)
        per_middle = v * draw(st.integers(1, 2)) if middle else 0
        num_layers = (first or 0) + (last or 0) + middle * per_middle
        fields |= {
            "num_layers_in_first_pipeline_stage": first,
            "num_layers_in_last_pipeline_stage": last,
        }
    else:
        counts = draw(st.lists(st.integers(0, 3), min_size=pp * v, max_size=pp * v))
        assume(sum(counts) >= 1)
        stages: list[list[str]] = [["decoder"] * c for c in counts]
        stages[0].insert(0, "embedding")
        stages[-1].append("loss")
        num_layers = sum(counts)
        as_string = draw(st.booleans())
        fields["pipeline_model_parallel_layout"] = (
            "|".join(
                "".join("E" if s == "embedding" else "L" if s == "loss" else "t" for s in row)
                for row in stages
            )
            if as_string
            else stages
        )
        vp = None  # the layout decides it
    fields["virtual_pipeline_model_parallel_size"] = vp
    fields["num_layers"] = num_layers
    fields["moe_layer_freq"] = draw(moe_freqs(num_layers))
    return fields


def megatron_config(mc: dict[str, Any], fields: dict[str, Any]) -> Any:
    """Megatron's TransformerConfig, or None where Megatron refuses these fields."""
    import torch

    freq = fields["moe_layer_freq"]
    megatron_fields = dict(fields)
    if isinstance(freq, str):  # the string form lives in the training arguments, not the config
        megatron_fields["moe_layer_freq"] = list(parse_moe_layer_freq(freq, fields["num_layers"]))
    try:
        return mc["tc"].TransformerConfig(
            hidden_size=16,
            num_attention_heads=2,
            num_moe_experts=4,
            add_bias_linear=False,
            pipeline_dtype=torch.float32,
            **megatron_fields,
        )
    except (ValueError, AssertionError, ZeroDivisionError):
        return None


def megatron_stages(mc: dict[str, Any], tc: Any) -> list[tuple[int, int]] | None:
    """Megatron's (offset, count) for every virtual stage in vp_stage-major order, or None
    where Megatron cannot place the layers itself (see :func:`megatron_defect`)."""
    pp = tc.pipeline_model_parallel_size
    vp = tc.virtual_pipeline_model_parallel_size
    with pipeline_state(mc["ps"], pp, vp):
        try:
            values = [
                megatron_stage(mc, tc, pp_rank, vp_stage)
                for vp_stage in (range(vp) if vp else [None])
                for pp_rank in range(pp)
            ]
        except ZeroDivisionError:
            assert megatron_defect(tc) == "no-middle-vpp", tc
            return None
    tiles = all(off == sum(c for _, c in values[:i]) for i, (off, _) in enumerate(values))
    if not tiles:
        assert megatron_defect(tc) == "overlap-without-first", (tc, values)
        return None
    return values


def megatron_defect(tc: Any) -> str | None:
    """The two uneven-VPP configs Megatron accepts but cannot place (its own inconsistencies):

    - "no-middle-vpp": VPP with both first and last stage set and no middle stage (pp=2):
      ``get_transformer_layer_offset`` divides by the zero middle stages (every line).
    - "overlap-without-first": VPP with only the last stage set: before 0.14 the offset uses
      ``pp_rank - 1`` where the stage is not shifted by a first stage, so stages overlap
      (fixed in 0.14).
    """
    first = tc.num_layers_in_first_pipeline_stage
    last = tc.num_layers_in_last_pipeline_stage
    if tc.virtual_pipeline_model_parallel_size is None or (first is None and last is None):
        return None
    if first is not None and last is not None and tc.pipeline_model_parallel_size == 2:
        return "no-middle-vpp"
    if first is None and Version("0.14") > LINE:
        return "overlap-without-first"
    return None


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(fields=split_configs())
def test_A3_offsets_and_counts_equal_megatrons_own(
    mc: dict[str, Any], fields: dict[str, Any]
) -> None:
    tc = megatron_config(mc, fields)
    assume(tc is not None)
    expected = megatron_stages(mc, tc)
    assume(expected is not None)
    cfg = layout_config(tc)
    if isinstance(fields["moe_layer_freq"], str):
        assert cfg == layout_config(tc)
    pp, vp = cfg.pp_size, cfg.vp_size
    got = [
        (layer_offset(cfg, pp_rank, vp_stage), num_layers_to_build(cfg, pp_rank, vp_stage))
        for vp_stage in (range(vp) if vp else [None])
        for pp_rank in range(pp)
    ]
    assert got == expected, fields


@pytest.mark.parametrize(
    ("first", "last", "defect"),
    [(2, 2, "no-middle-vpp"), (None, 2, "overlap-without-first")],
)
def test_megatron_uneven_vpp_defects_are_where_the_generator_says(
    mc: dict[str, Any], first: int | None, last: int | None, defect: str
) -> None:
    """The configs the equality test discards really are broken in Megatron on this line."""
    fields = {
        "num_layers": 4,
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "num_layers_in_first_pipeline_stage": first,
        "num_layers_in_last_pipeline_stage": last,
        "moe_layer_freq": 1,
    }
    tc = megatron_config(mc, fields)
    if tc is None:  # 0.12 refuses both first and last with no middle stage in the config
        assert Version("0.13") > LINE
        assert defect == "no-middle-vpp"
        return
    if megatron_defect(tc) != defect:  # fixed on this line: then rr must agree with Megatron
        assert megatron_stages(mc, tc) is not None
        return
    assert megatron_stages(mc, tc) is None


def _layout_kwargs(cfg: LayoutConfig) -> dict[str, Any]:
    names = [
        "num_layers",
        "pp_size",
        "vp_size",
        "first_stage_layers",
        "last_stage_layers",
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
        "stage_layer_counts",
    ]
    return {name: getattr(cfg, name) for name in names}


@settings(max_examples=25, deadline=None)
@given(num_layers=st.integers(1, 8), data=st.data())
def test_A2_moe_pattern_equals_megatrons_block_spec(
    mc: dict[str, Any], num_layers: int, data: st.DataObject
) -> None:
    """Which layers get an MoE MLP: rr-core's pattern equals the spec Megatron builds."""
    freq = data.draw(moe_freqs(num_layers))
    tc = megatron_config(mc, {"num_layers": num_layers, "moe_layer_freq": freq})
    cfg = layout_config(tc)
    kwargs = {"vp_stage": None} if Version("0.13") <= LINE else {}
    with pipeline_state(mc["ps"], 1, None):
        mc["ps"].set_pipeline_model_parallel_rank(0)
        spec = mc["specs"].get_gpt_decoder_block_spec(tc, use_transformer_engine=False, **kwargs)
    built = tuple(_is_moe_mlp(layer.submodules.mlp) for layer in spec.layer_specs)
    assert built == moe_pattern(cfg)


def _is_moe_mlp(mlp: Any) -> bool:
    """A layer spec's MLP entry: a ModuleSpec, or (0.19) a partial that builds one."""
    module = getattr(mlp, "module", None) or getattr(mlp, "func", None)
    module = getattr(module, "__self__", module)  # MLP.as_mlp_submodule bound to its class
    if module is None or not isinstance(module, type):
        raise AssertionError(f"unexpected MLP spec {mlp!r}")
    return module.__name__ == "MoELayer"


# -- the adapter's own checks ---------------------------------------------------------------------


def test_vpp_sizes_come_from_the_config_or_the_caller(mc: dict[str, Any]) -> None:
    tc = megatron_config(
        mc, {"num_layers": 8, "pipeline_model_parallel_size": 2, "moe_layer_freq": 1}
    )
    assert virtual_stage_layer_counts(layout_config(tc)) == (4, 4)
    assert virtual_stage_layer_counts(layout_config(tc, vp_size=2)) == (2, 2, 2, 2)
    assert layout_config(tc, vp_size=1).vp_size is None


@pytest.mark.skipif(not HAS_LAYOUT, reason="pipeline_model_parallel_layout arrived in 0.13")
def test_layout_counts_only_decoder_layers(mc: dict[str, Any]) -> None:
    tc = megatron_config(
        mc,
        {
            "num_layers": 5,
            "pipeline_model_parallel_size": 2,
            "pipeline_model_parallel_layout": [
                ["embedding", "decoder"],
                ["decoder"] * 2,
                [],
                ["decoder"] * 2 + ["loss"],
            ],
            "moe_layer_freq": [0, 1, 1, 0, 1],
        },
    )
    cfg = layout_config(tc)
    assert (cfg.vp_size, virtual_stage_layer_counts(cfg)) == (2, (1, 2, 0, 2))
    with pytest.raises(LayoutError, match="conflicts"):
        layout_config(tc, vp_size=3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2),
        ("[1,0]*2", (1, 0, 1, 0)),
        ("[0]*1+[1]*3", (0, 1, 1, 1)),
        ("[0, 1]+[1]*2", (0, 1, 1, 1)),
    ],
)
def test_moe_layer_freq_string_form(text: str, expected: object) -> None:
    assert parse_moe_layer_freq(text, 4) == expected


@pytest.mark.parametrize("text", ["[2]*4", "__import__('os')", "[1]*3"])
def test_moe_layer_freq_string_form_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(LayoutError):
        parse_moe_layer_freq(text, 4)
