"""Megatron's ``TransformerConfig`` as rr-core's :class:`~rr_core.LayoutConfig`.

rr-core does the layer arithmetic (offsets, per-stage counts, MoE ordinals) without importing
Megatron; this module only reads the settings that decide it from a Megatron config, so that
``rr_core.layer_offset(layout_config(tc), pp_rank, vp_stage)`` equals Megatron's own
``get_transformer_layer_offset`` on every supported line (the compat tests prove it against the
real functions). Nothing here imports megatron unless the config carries an unparsed
``pipeline_model_parallel_layout``.

Settings read: ``num_layers``, ``moe_layer_freq`` (int, 0/1 list, or the training arguments'
string form such as ``"[0]*3+[1]*58"``), ``pipeline_model_parallel_size``,
``virtual_pipeline_model_parallel_size``, ``num_layers_in_first/last_pipeline_stage``,
``account_for_embedding/loss_in_pipeline_split`` and, from 0.13, ``pipeline_model_parallel_layout``
(turned into explicit per-stage decoder counts; embedding, loss and MTP entries are not decoder
layers).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Sequence
from typing import Any

from rr_core import LayoutConfig, LayoutError
from rr_megatron_compat._checks import as_index
from rr_megatron_compat._versions import import_megatron
from rr_megatron_compat._wire import parallel_state

_FREQ_TERM = re.compile(r"^\[([01](?:\s*,\s*[01])*)\]\s*\*\s*(\d+)$|^\[([01](?:\s*,\s*[01])*)\]$")


def parse_moe_layer_freq(freq: object, num_layers: int) -> int | tuple[int, ...]:
    """``moe_layer_freq`` as rr-core takes it: an int, or one 0/1 entry per decoder layer.

    Accepts Megatron's forms: an int N (every N-th layer from layer 1 is MoE), a 0/1 list, and
    the string form of its training arguments (``"4"``, ``"[1,0]*4"``, ``"[0]*3+[1]*5"``),
    parsed without ``eval``.
    """
    num_layers = as_index(num_layers, "num_layers", LayoutError)
    if num_layers < 1:
        raise LayoutError(f"num_layers must be >= 1; got {num_layers}")
    parsed = _parse_freq(freq, num_layers)
    if isinstance(parsed, int):
        if parsed < 1:
            raise LayoutError(f"moe_layer_freq as an int must be >= 1; got {freq!r}")
    elif len(parsed) != num_layers or not set(parsed) <= {0, 1}:
        raise LayoutError(
            f"moe_layer_freq {freq!r} must hold one 0/1 entry per decoder layer "
            f"(num_layers={num_layers}); got {len(parsed)} entries {list(parsed)}"
        )
    return parsed


def _parse_freq(freq: object, num_layers: int) -> int | tuple[int, ...]:
    if isinstance(freq, str):
        return _parse_freq_string(freq, num_layers)
    if isinstance(freq, bool):
        raise LayoutError(f"moe_layer_freq must be an int, a 0/1 list or a string; got {freq!r}")
    if isinstance(freq, int):
        return freq
    if isinstance(freq, Sequence):
        try:
            return tuple(operator.index(v) for v in freq)
        except TypeError as exc:
            raise LayoutError(f"moe_layer_freq entries must be 0 or 1; got {freq!r}") from exc
    raise LayoutError(f"moe_layer_freq must be an int, a 0/1 list or a string; got {freq!r}")


def _parse_freq_string(text: str, num_layers: int) -> int | tuple[int, ...]:
    stripped = text.strip()
    if re.fullmatch(r"\d+", stripped):
        return int(stripped)
    values: list[int] = []
    for term in stripped.split("+"):
        match = _FREQ_TERM.match(term.strip())
        if match is None:
            raise LayoutError(
                f"cannot parse moe_layer_freq {text!r}: expected an int or terms like '[0]*3' and "
                "'[1,0]' joined by '+' (e.g. '[0]*3+[1]*58')"
            )
        body, times = (match[1], int(match[2])) if match[1] is not None else (match[3], 1)
        values.extend(list(ast.literal_eval(f"[{body}]")) * times)
    if len(values) != num_layers:
        raise LayoutError(
            f"moe_layer_freq {text!r} expands to {len(values)} entries but num_layers={num_layers}"
        )
    return tuple(values)


def layout_config(
    config: Any, *, pp_size: int | None = None, vp_size: int | None = None
) -> LayoutConfig:
    """The decoder layer layout of a Megatron ``TransformerConfig`` (or ``MLATransformerConfig``).

    ``pp_size`` / ``vp_size`` override the config's pipeline sizes (a config built before the
    parallel state is initialised may still carry the defaults); ``vp_size`` 1 means no virtual
    pipeline. Raises :class:`~rr_core.LayoutError` for a split Megatron would refuse.
    """
    if not hasattr(config, "num_layers"):
        raise LayoutError(
            "layout_config takes a Megatron TransformerConfig (or an object with its num_layers "
            f"and pipeline fields); got {type(config).__name__} without num_layers"
        )
    num_layers = as_index(config.num_layers, "config.num_layers", LayoutError)
    pp_raw = pp_size if pp_size is not None else getattr(config, "pipeline_model_parallel_size", 1)
    pp = as_index(
        pp_raw or 1,
        "pp_size" if pp_size is not None else "config.pipeline_model_parallel_size",
        LayoutError,
    )
    vp_raw = (
        vp_size
        if vp_size is not None
        else getattr(config, "virtual_pipeline_model_parallel_size", None)
    )
    vp_what = "vp_size" if vp_size is not None else "config.virtual_pipeline_model_parallel_size"
    vp_int = None if vp_raw is None else as_index(vp_raw, vp_what, LayoutError)
    vp = None if vp_int in (None, 1) else vp_int
    freq = parse_moe_layer_freq(getattr(config, "moe_layer_freq", 1), num_layers)
    # A probe of the object, not of the release: 0.12 configs lack the field (0.13+ have it), and
    # so may the duck-typed configs verl's layout functions accept on any line.
    pp_layout = getattr(config, "pipeline_model_parallel_layout", None)
    if pp_layout is not None:
        counts, layout_vp = _layout_stage_counts(pp_layout, pp)
        if vp is not None and vp != layout_vp:
            raise LayoutError(
                f"vp_size={vp} conflicts with pipeline_model_parallel_layout, which has "
                f"{layout_vp} virtual stages per pipeline rank; drop vp_size or fix the layout"
            )
        return LayoutConfig(
            num_layers=num_layers,
            moe_layer_freq=freq,
            pp_size=pp,
            vp_size=layout_vp if layout_vp > 1 else None,
            stage_layer_counts=counts,
        )
    return LayoutConfig(
        num_layers=num_layers,
        moe_layer_freq=freq,
        pp_size=pp,
        vp_size=vp,
        first_stage_layers=getattr(config, "num_layers_in_first_pipeline_stage", None),
        last_stage_layers=getattr(config, "num_layers_in_last_pipeline_stage", None),
        account_for_embedding_in_pipeline_split=bool(
            getattr(config, "account_for_embedding_in_pipeline_split", False)
        ),
        account_for_loss_in_pipeline_split=bool(
            getattr(config, "account_for_loss_in_pipeline_split", False)
        ),
    )


def _layout_stage_counts(pp_layout: Any, pp_size: int) -> tuple[tuple[int, ...], int]:
    """Decoder layers per virtual stage (vp_stage-major) of a ``PipelineParallelLayerLayout``."""
    if isinstance(pp_layout, (str, list)):  # a config whose __post_init__ did not run
        module = import_megatron("megatron.core.transformer.pipeline_parallel_layer_layout")
        cls = module.PipelineParallelLayerLayout
        if isinstance(pp_layout, str):
            pp_layout = cls.from_str(layout=pp_layout, pipeline_model_parallel_size=pp_size)
        else:
            pp_layout = cls(layout=pp_layout, pipeline_model_parallel_size=pp_size)
    grid = pp_layout.layout  # [pp_rank][vp_stage] -> list of LayerType
    if len(grid) != pp_size:
        raise LayoutError(
            f"pipeline_model_parallel_layout has {len(grid)} pipeline ranks but pp_size={pp_size}"
        )
    vp = len(grid[0])
    counts = tuple(
        sum(1 for kind in grid[rank][stage] if _is_decoder(kind))
        for stage in range(vp)
        for rank in range(pp_size)
    )
    return counts, vp


def _is_decoder(kind: object) -> bool:
    name = getattr(kind, "name", kind)
    return isinstance(name, str) and name.strip().lower() == "decoder"


def current_pipeline_rank() -> int:
    """This process's rank in Megatron's pipeline group (``parallel_state``; needs it set up)."""
    return int(parallel_state("get_pipeline_model_parallel_rank", LayoutError))
