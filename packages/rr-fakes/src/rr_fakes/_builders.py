"""Builders of fake MoE models for every layout that has broken routing replay in the field.

Each builder is deterministic in ``FakeModelConfig.seed`` and never touches torch's global RNG.
Which layers are MoE is rr_core's rule (:func:`rr_core.moe_pattern`, the one statement of
``moe_layer_freq``); the VPP split is written out here on purpose rather than taken from
``rr_core``, so tests that compare the two check rr_core's stage math against an independent
statement of Megatron's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from rr_core import LayoutConfig
from rr_core import moe_pattern as layout_moe_pattern
from rr_fakes._models import (
    FakeDecoder,
    FakeDenseLayer,
    FakeHashLayer,
    FakeMixer,
    FakeMoELayer,
    FakeMoEModel,
)
from rr_fakes._routers import FakeHashGate, FakeTopKRouter, RouterRegistry, ScoreFunction


@dataclass(frozen=True, kw_only=True)
class FakeModelConfig:
    """Sizes and routing of a fake model; names follow Megatron's TransformerConfig.

    ``moe_layer_freq``: an int N makes 0-based layer i MoE iff ``i % N == 0``; a 0/1 sequence
    (one entry per decoder layer, DeepSeek's ``first_k_dense_replace`` as ``[0]*k + [1]*...``)
    marks MoE layers with 1 (A2, A3). The first ``hash_layers`` MoE layers are hash-routed (A5).
    ``mtp_layers`` MTP layers restart numbering at 1; ``mtp_flagged`` sets ``is_mtp_layer`` on
    their routers, as Megatron does from 0.17 (before that only the ``mtp`` path tells them
    apart) (A4).
    """

    num_layers: int = 4
    hidden_size: int = 8
    vocab_size: int = 32
    num_experts: int = 6
    top_k: int = 2
    moe_layer_freq: int | Sequence[int] = 1
    hash_layers: int = 0
    mtp_layers: int = 0
    mtp_flagged: bool = True
    score_function: ScoreFunction = "softmax"
    pre_softmax: bool = True
    num_groups: int | None = None
    group_topk: int | None = None
    expert_bias: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1; got {self.num_layers}")
        if isinstance(self.moe_layer_freq, Sequence):
            object.__setattr__(self, "moe_layer_freq", tuple(int(v) for v in self.moe_layer_freq))
        moe_layers = sum(moe_pattern(self))  # a bad frequency raises LayoutError (a ValueError)
        if self.hash_layers > moe_layers:
            raise ValueError(f"hash_layers={self.hash_layers} exceeds the {moe_layers} MoE layers")


def moe_pattern(config: FakeModelConfig) -> tuple[bool, ...]:
    """Per decoder layer (index 0 = layer 1): is it an MoE layer (routed or hash-routed)?"""
    layout = LayoutConfig(num_layers=config.num_layers, moe_layer_freq=config.moe_layer_freq)
    return layout_moe_pattern(layout)


def routed_layer_numbers(config: FakeModelConfig) -> tuple[int, ...]:
    """Global numbers of the layers with a :class:`FakeTopKRouter` (hash layers excluded)."""
    moe = [i + 1 for i, is_moe in enumerate(moe_pattern(config)) if is_moe]
    return tuple(moe[config.hash_layers :])


def _router(
    config: FakeModelConfig,
    layer_number: int,
    generator: torch.Generator,
    registry: RouterRegistry | None,
    *,
    mtp: bool = False,
) -> FakeTopKRouter:
    return FakeTopKRouter(
        config.hidden_size,
        config.num_experts,
        config.top_k,
        layer_number=layer_number,
        is_mtp_layer=mtp and config.mtp_flagged,
        score_function=config.score_function,
        pre_softmax=config.pre_softmax,
        num_groups=config.num_groups,
        group_topk=config.group_topk,
        expert_bias=config.expert_bias,
        generator=generator,
        registry=registry,
    )


def _layer(
    config: FakeModelConfig,
    layer_number: int,
    generator: torch.Generator,
    registry: RouterRegistry | None,
) -> nn.Module:
    h = config.hidden_size
    if not moe_pattern(config)[layer_number - 1]:
        return FakeDenseLayer(layer_number, h, generator)
    if layer_number not in routed_layer_numbers(config):
        gate = FakeHashGate(h, config.num_experts, config.top_k, generator=generator)
        return FakeHashLayer(layer_number, h, gate, generator)
    return FakeMoELayer(
        layer_number, h, _router(config, layer_number, generator, registry), generator
    )


def _generator(config: FakeModelConfig, stream: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(config.seed * 1_000_003 + stream)


def _layer_seed_generator(config: FakeModelConfig, layer_number: int) -> torch.Generator:
    """A generator per layer, so a layer's weights do not depend on which chunk builds it."""
    return _generator(config, 1 + layer_number)


def build_model(
    config: FakeModelConfig,
    *,
    layer_numbers: Sequence[int] | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    registry: RouterRegistry | None = None,
) -> FakeMoEModel:
    """A plain decoder (layers 1..num_layers, or ``layer_numbers`` for one pipeline chunk) with
    the dense / hash / MoE layout and MTP block that ``config`` describes. Routers append
    themselves to ``registry`` in construction order, decoder first, then MTP."""
    numbers = list(range(1, config.num_layers + 1)) if layer_numbers is None else layer_numbers
    for number in numbers:
        if not 1 <= number <= config.num_layers:
            raise ValueError(f"layer number {number} is outside 1..{config.num_layers}")
    layers = nn.ModuleList(
        _layer(config, n, _layer_seed_generator(config, n), registry) for n in numbers
    )
    mtp = None
    if config.mtp_layers and post_process:
        mtp_generator = _generator(config, 1 + config.num_layers + 1)
        mtp = FakeDecoder(
            nn.ModuleList(
                FakeMoELayer(
                    i + 1,
                    config.hidden_size,
                    _router(config, i + 1, mtp_generator, registry, mtp=True),
                    mtp_generator,
                )
                for i in range(config.mtp_layers)
            )
        )
    return FakeMoEModel(
        FakeDecoder(layers),
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        generator=_generator(config),
        mtp=mtp,
        pre_process=pre_process,
        post_process=post_process,
    )


def build_orphans_then_model(
    config: FakeModelConfig, *, registry: RouterRegistry | None = None
) -> tuple[FakeMoEModel, RouterRegistry]:
    """A1: the decoder is built twice, as Megatron-Bridge does for Qwen3-VL / Qwen3.5; the first
    build is discarded but its routers stay registered, first. Returns the live model and the
    registry (2 x routers, orphans first). The orphans have the live routers' weights, so a
    positional lookup that picks them looks plausible."""
    registry = [] if registry is None else registry
    discarded = build_model(config, registry=registry)
    del discarded  # only the registry keeps its routers alive, as the global list does
    return build_model(config, registry=registry), registry


def vpp_chunk_layer_numbers(
    num_layers: int, *, pp_size: int, vp_size: int, pp_rank: int
) -> list[list[int]]:
    """Megatron's even split: layers are dealt in blocks of ``num_layers / (pp * vp)`` to
    virtual stages ``vp_stage * pp_size + pp_rank``; returns this rank's chunks' numbers."""
    stages = pp_size * vp_size
    if vp_size > 1 and pp_size == 1:
        raise ValueError(
            f"VPP (vp_size={vp_size}) needs pp_size > 1; Megatron does not split one stage "
            "into virtual stages"
        )
    if num_layers % stages or not 0 <= pp_rank < pp_size:
        raise ValueError(
            f"an even VPP split needs num_layers % (pp_size * vp_size) == 0 and "
            f"0 <= pp_rank < pp_size; got {num_layers=}, {pp_size=}, {vp_size=}, {pp_rank=}"
        )
    per_chunk = num_layers // stages
    return [
        list(
            range(
                (v * pp_size + pp_rank) * per_chunk + 1, (v * pp_size + pp_rank + 1) * per_chunk + 1
            )
        )
        for v in range(vp_size)
    ]


def build_vpp_chunks(
    config: FakeModelConfig,
    *,
    pp_size: int,
    vp_size: int,
    pp_rank: int,
    registry: RouterRegistry | None = None,
) -> list[FakeMoEModel]:
    """The model chunks one pipeline rank holds under virtual pipelining (A3, B1): a list, as
    Megatron's ``get_model`` returns it, with global layer numbers. Only the first virtual
    stage embeds and only the last projects (and holds the MTP block)."""
    chunks = vpp_chunk_layer_numbers(
        config.num_layers, pp_size=pp_size, vp_size=vp_size, pp_rank=pp_rank
    )
    last = vp_size - 1
    return [
        build_model(
            config,
            layer_numbers=numbers,
            pre_process=v == 0 and pp_rank == 0,
            post_process=v == last and pp_rank == pp_size - 1,
            registry=registry,
        )
        for v, numbers in enumerate(chunks)
    ]


def build_hybrid_model(
    config: FakeModelConfig,
    *,
    mixers_between: int = 1,
    registration_order: Sequence[int] | None = None,
    registry: RouterRegistry | None = None,
) -> FakeMoEModel:
    """A6: a hybrid decoder with ``mixers_between`` layer-number-less blocks (Mamba / attention
    stand-ins) before every decoder layer, registered in another order than they run. By
    default decoder layers are registered last-first; ``registration_order`` (a permutation of
    0-based layer indices) sets it. ``named_modules()`` order then differs from layer order."""
    base = build_model(replace(config, mtp_layers=0), registry=registry)
    decoder_layers = list(base.decoder.ordered_layers())
    n = len(decoder_layers)
    order = list(reversed(range(n))) if registration_order is None else list(registration_order)
    if sorted(order) != list(range(n)):
        raise ValueError(f"registration_order must be a permutation of 0..{n - 1}; got {order}")
    children: dict[str, nn.Module] = {}
    for i in order:
        children[f"block{i}_layer"] = decoder_layers[i]
        for j in range(mixers_between):
            children[f"block{i}_mixer{j}"] = FakeMixer(config.hidden_size)
    run_order = [
        name
        for i in range(n)
        for name in (*(f"block{i}_mixer{j}" for j in range(mixers_between)), f"block{i}_layer")
    ]
    base.decoder = FakeDecoder(nn.ModuleDict(children), order=run_order)
    return base
