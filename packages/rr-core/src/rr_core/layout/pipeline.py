"""Layer layout: which decoder layers are MoE, and which pipeline stage holds which layers.

Megatron numbers decoder layers globally from 1 (``layer_number``) across PP ranks and VPP chunks,
engines report one route slot per decoder layer, and the trainer has routers only on MoE layers.
Replay is exact only if every party maps a layer to the same slot, so this module is the single
place that does that arithmetic, without importing Megatron.

Layers are dealt contiguously to *virtual stages* in the order
``index = vp_stage * pp_size + pp_rank``; a stage's offset is the sum of the counts before it.
With an even VPP split of c layers a chunk, pp_rank 0 holds 1..c, then pp_size * c + 1.. next.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rr_core.errors import LayoutError
from rr_core.routes.args import as_index

#: The most decoder layers a layout may have: far above any model (the deepest MoE models have
#: about a hundred), low enough that the per-layer tables a config builds stay small (a typo
#: like ``num_layers=10**20`` is refused, not a hang while they are built).
MAX_LAYERS = 1 << 16


@dataclass(frozen=True, kw_only=True)
class LayoutConfig:
    """The Megatron settings that decide the decoder layer layout (MTP layers are not counted).

    ``moe_layer_freq``: an int N makes 0-based layer i MoE iff ``i % N == 0``; a 0/1 sequence (one
    entry per decoder layer) marks MoE layers with 1. ``stage_layer_counts``, when given, is the
    number of decoder layers per virtual stage (vp_stage-major) and replaces the computed split.
    Sequences are stored as tuples. Every inconsistency raises :class:`LayoutError` here, so a
    config that exists is one whose stages cover layers 1..num_layers exactly once.
    """

    num_layers: int
    moe_layer_freq: int | Sequence[int] = 1
    pp_size: int = 1
    vp_size: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    stage_layer_counts: Sequence[int] | None = None
    _stage_counts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _moe_mask: tuple[bool, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "pp_size"):
            _check_positive(name, getattr(self, name))
        if self.num_layers > MAX_LAYERS:
            raise LayoutError(
                f"num_layers={self.num_layers} is above rr's limit of {MAX_LAYERS} decoder layers "
                "(MTP layers excluded); pass the model's decoder layer count"
            )
        for name in ("vp_size", "first_stage_layers", "last_stage_layers"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        object.__setattr__(self, "_moe_mask", _derive_moe_mask(self))
        if isinstance(self.moe_layer_freq, Sequence):
            object.__setattr__(self, "moe_layer_freq", tuple(int(v) for v in self.moe_layer_freq))
        if self.stage_layer_counts is not None:
            object.__setattr__(self, "stage_layer_counts", _explicit_counts(self))
            counts = self.stage_layer_counts
        else:
            counts = _computed_counts(self)
        object.__setattr__(self, "_stage_counts", tuple(counts))

    @property
    def num_virtual_stages(self) -> int:
        """pp_size * (vp_size or 1): the number of model chunks over all pipeline ranks."""
        return self.pp_size * (self.vp_size or 1)


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(f"{name} must be a positive int, got {value!r}")


def _derive_moe_mask(cfg: LayoutConfig) -> tuple[bool, ...]:
    freq = cfg.moe_layer_freq
    n = cfg.num_layers
    if isinstance(freq, (bool, str)):
        raise LayoutError(
            f"moe_layer_freq must be an int or a 0/1 sequence, got {freq!r}; parse Megatron's "
            "string form (e.g. '[0]*3+[1]*58') into a list first"
        )
    if isinstance(freq, int):
        _check_positive("moe_layer_freq", freq)
        return tuple(i % freq == 0 for i in range(n))
    if not isinstance(freq, Iterable):
        raise LayoutError(
            f"moe_layer_freq must be an int or a 0/1 sequence, got {type(freq).__name__} {freq!r}"
        )
    try:
        values = [operator.index(v) for v in freq]
    except TypeError as exc:
        raise LayoutError(f"moe_layer_freq entries must be 0 or 1, got {list(freq)!r}") from exc
    if len(values) != n:
        raise LayoutError(
            f"moe_layer_freq has {len(values)} entries but num_layers={n}; give one 0/1 entry "
            "per decoder layer (MTP layers excluded)"
        )
    bad = [(i, v) for i, v in enumerate(values) if v not in (0, 1)]
    if bad:
        raise LayoutError(f"moe_layer_freq entries must be 0 or 1; (index, value) pairs {bad}")
    return tuple(v == 1 for v in values)


def _explicit_counts(cfg: LayoutConfig) -> tuple[int, ...]:
    assert cfg.stage_layer_counts is not None
    overridden = [
        name
        for name in (
            "first_stage_layers",
            "last_stage_layers",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        )
        if getattr(cfg, name) not in (None, False)
    ]
    if overridden:
        raise LayoutError(
            f"stage_layer_counts replaces the computed split, so {overridden} would be ignored; "
            "leave them unset (count the embedding/loss out of the explicit stage counts)"
        )
    counts = tuple(cfg.stage_layer_counts)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise LayoutError(f"stage_layer_counts must be ints >= 0, got {counts}")
    if len(counts) != cfg.num_virtual_stages:
        raise LayoutError(
            f"stage_layer_counts has {len(counts)} entries but pp_size={cfg.pp_size} x "
            f"vp_size={cfg.vp_size} needs {cfg.num_virtual_stages} (ordered vp_stage-major)"
        )
    if sum(counts) != cfg.num_layers:
        raise LayoutError(
            f"stage_layer_counts {counts} sum to {sum(counts)} but num_layers={cfg.num_layers}"
        )
    return counts


def _computed_counts(cfg: LayoutConfig) -> tuple[int, ...]:
    """Megatron's get_num_layers_to_build for every (vp_stage, pp_rank), with its config checks."""
    pp, vp, n = cfg.pp_size, cfg.vp_size or 1, cfg.num_layers
    emb = int(cfg.account_for_embedding_in_pipeline_split)
    loss = int(cfg.account_for_loss_in_pipeline_split)
    first, last = cfg.first_stage_layers, cfg.last_stage_layers
    if vp > 1 and pp == 1:
        raise LayoutError(
            f"vp_size={vp} with pp_size=1: Megatron splits layers over virtual stages only when "
            "pp_size > 1, so every chunk would build all layers; set vp_size=None"
        )
    if first is not None or last is not None:
        if emb or loss:
            raise LayoutError(
                f"first_stage_layers={first} / last_stage_layers={last} cannot be combined with "
                "account_for_embedding/loss_in_pipeline_split (Megatron refuses it); use one"
            )
        if pp < 2:
            raise LayoutError(
                f"first_stage_layers={first} / last_stage_layers={last} need pp_size >= 2, got "
                f"pp_size={pp}; leave them unset"
            )
        middle_stages = pp - (first is not None) - (last is not None)
        middle_layers = n - (first or 0) - (last or 0)
        if middle_layers < 0 or (middle_stages == 0 and middle_layers != 0):
            raise LayoutError(
                f"first_stage_layers={first} + last_stage_layers={last} leave {middle_layers} "
                f"layers of num_layers={n} for {middle_stages} middle stages; make them add up"
            )
        if middle_stages and middle_layers % middle_stages:
            raise LayoutError(
                f"the {middle_layers} layers left for the {middle_stages} middle pipeline stages "
                f"(num_layers={n} minus first/last) are not divisible by {middle_stages}; change "
                "first_stage_layers/last_stage_layers"
            )
        per_rank = [middle_layers // middle_stages if middle_stages else 0] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        total = n + emb + loss
        if total % pp:
            raise LayoutError(
                f"num_layers={n} + embedding ({emb}) + loss ({loss}) = {total} is not divisible "
                f"by pp_size={pp}; change num_layers or use first/last_stage_layers"
            )
        per_rank = [total // pp] * pp
    for rank, count in enumerate(per_rank):
        if count % vp:
            raise LayoutError(
                f"pp_rank {rank} gets {count} layers, not divisible by vp_size={vp}; change "
                "vp_size or the pipeline split"
            )
    counts = [per_rank[rank] // vp for _ in range(vp) for rank in range(pp)]
    counts[0] -= emb
    counts[-1] -= loss
    # Each rank holds >= vp layers, so only a lone stage can lose both; it then holds num_layers.
    assert min(counts) >= 0, counts
    assert sum(counts) == n, (counts, n)
    return tuple(counts)


# --- MoE pattern ---------------------------------------------------------------------------------


def moe_pattern(cfg: LayoutConfig) -> tuple[bool, ...]:
    """One flag per decoder layer (index i = layer_number i+1): True where the layer is MoE."""
    _check_config(cfg)
    return cfg._moe_mask


def _check_layer_number(cfg: LayoutConfig, layer_number: int) -> None:
    _check_config(cfg)
    if not 1 <= as_index(layer_number, "layer_number", LayoutError) <= cfg.num_layers:
        raise LayoutError(
            f"layer_number {layer_number!r} is outside 1..{cfg.num_layers}; decoder layer numbers "
            "are global and 1-based (MTP layers are not on this axis)"
        )


def is_moe_layer(cfg: LayoutConfig, layer_number: int) -> bool:
    """Whether global 1-based decoder layer ``layer_number`` has a router."""
    _check_layer_number(cfg, layer_number)
    return cfg._moe_mask[layer_number - 1]


def moe_layer_numbers(cfg: LayoutConfig) -> tuple[int, ...]:
    """Global 1-based numbers of the MoE layers; position j is slot j of the ``moe_layers`` axis."""
    _check_config(cfg)
    return tuple(i + 1 for i, moe in enumerate(cfg._moe_mask) if moe)


def dense_layer_numbers(cfg: LayoutConfig) -> tuple[int, ...]:
    """Global 1-based numbers of the dense layers (their ``all_layers`` slots carry no route)."""
    _check_config(cfg)
    return tuple(i + 1 for i, moe in enumerate(cfg._moe_mask) if not moe)


def num_moe_layers(cfg: LayoutConfig) -> int:
    """Length of the ``moe_layers`` axis."""
    _check_config(cfg)
    return sum(cfg._moe_mask)


def moe_ordinal(cfg: LayoutConfig, layer_number: int) -> int:
    """0-based slot of MoE layer ``layer_number`` on the ``moe_layers`` axis; dense ones raise."""
    if not is_moe_layer(cfg, layer_number):
        raise LayoutError(
            f"layer {layer_number} is dense (MoE layers: {moe_layer_numbers(cfg)}); it has no "
            "slot on the moe_layers axis"
        )
    return sum(cfg._moe_mask[: layer_number - 1])


# --- pipeline stages -----------------------------------------------------------------------------


def virtual_stage_layer_counts(cfg: LayoutConfig) -> tuple[int, ...]:
    """Decoder layers per virtual stage, index ``vp_stage * pp_size + pp_rank``."""
    _check_config(cfg)
    return cfg._stage_counts


def _check_config(cfg: object) -> None:
    if not isinstance(cfg, LayoutConfig):
        raise LayoutError(f"cfg must be a LayoutConfig; got {type(cfg).__name__}")


def _virtual_index(cfg: LayoutConfig, pp_rank: int, vp_stage: int | None) -> int:
    _check_config(cfg)
    if not 0 <= as_index(pp_rank, "pp_rank", LayoutError) < cfg.pp_size:
        raise LayoutError(f"pp_rank {pp_rank!r} is outside 0..{cfg.pp_size - 1}")
    if cfg.vp_size is None:
        if vp_stage is not None:
            raise LayoutError(f"vp_stage={vp_stage} given but vp_size is None; pass vp_stage=None")
        return pp_rank
    if vp_stage is None:
        raise LayoutError(
            f"vp_size={cfg.vp_size} but vp_stage is None; pass the model chunk's vp_stage "
            "(falling back to the current global rank gives wrong offsets)"
        )
    if not 0 <= as_index(vp_stage, "vp_stage", LayoutError) < cfg.vp_size:
        raise LayoutError(f"vp_stage {vp_stage!r} is outside 0..{cfg.vp_size - 1}")
    return vp_stage * cfg.pp_size + pp_rank


def num_layers_to_build(cfg: LayoutConfig, pp_rank: int, vp_stage: int | None = None) -> int:
    """Decoder layers held by one stage (Megatron's ``get_num_layers_to_build``)."""
    index = _virtual_index(cfg, pp_rank, vp_stage)  # checks cfg before it is read
    return cfg._stage_counts[index]


def layer_offset(cfg: LayoutConfig, pp_rank: int, vp_stage: int | None = None) -> int:
    """Layers before one stage (Megatron's ``get_transformer_layer_offset``)."""
    index = _virtual_index(cfg, pp_rank, vp_stage)  # checks cfg before it is read
    return sum(cfg._stage_counts[:index])


def stage_layer_numbers(
    cfg: LayoutConfig, pp_rank: int, vp_stage: int | None = None
) -> tuple[int, ...]:
    """Global 1-based numbers of the decoder layers one stage holds, in order."""
    start = layer_offset(cfg, pp_rank, vp_stage)
    return tuple(range(start + 1, start + num_layers_to_build(cfg, pp_rank, vp_stage) + 1))


def stage_moe_layer_numbers(
    cfg: LayoutConfig, pp_rank: int, vp_stage: int | None = None
) -> tuple[int, ...]:
    """Global numbers of the MoE layers (routers) one stage holds."""
    return tuple(n for n in stage_layer_numbers(cfg, pp_rank, vp_stage) if cfg._moe_mask[n - 1])


def moe_ordinals_of_stage(
    cfg: LayoutConfig, pp_rank: int, vp_stage: int | None = None
) -> tuple[int, ...]:
    """``moe_layers`` slots of one stage: offset by the MoE layers before it, not all layers."""
    start = layer_offset(cfg, pp_rank, vp_stage)
    first = sum(cfg._moe_mask[:start])
    return tuple(range(first, first + len(stage_moe_layer_numbers(cfg, pp_rank, vp_stage))))


def stage_of_layer(cfg: LayoutConfig, layer_number: int) -> tuple[int, int | None]:
    """``(pp_rank, vp_stage)`` holding global layer ``layer_number`` (vp_stage None without VPP)."""
    _check_layer_number(cfg, layer_number)
    ends = list(itertools.accumulate(cfg._stage_counts))
    vp_stage, pp_rank = divmod(bisect.bisect_left(ends, layer_number), cfg.pp_size)
    return pp_rank, (vp_stage if cfg.vp_size is not None else None)
