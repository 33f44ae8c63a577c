"""Recorded routes across pipeline stages: per-chunk records onto the global ``moe_layers`` axis.

A pipeline rank holds one model chunk per virtual stage (VPP) and records, per router, the ids
of one micro-batch; under Megatron's interleaved schedule those records arrive in execution
order, not layer order. Records are therefore keyed by the router's global ``layer_number`` and
placed by the layout: virtual stage ``vp_stage * pp + pp_rank`` owns the MoE slots
:func:`rr_core.moe_ordinals_of_stage` gives, which count MoE layers, not layers (A3).

:func:`pp_gather` then collects every rank's block over the pipeline group. Every rank of the
group takes part, including one with no MoE layer at all (A6): it contributes an empty block,
and a header exchange (one small int64 ``all_gather``) checks that all ranks agree on token
count, top-k and dtype before any payload moves. Payloads keep their narrow dtype (uint8/int16)
and travel as uint8 views; the result is widened only if the caller asks for ``dtype``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rr_core import (
    LayoutConfig,
    LayoutError,
    moe_ordinals_of_stage,
    num_moe_layers,
    stage_moe_layer_numbers,
)
from rr_megatron_compat._checks import check_instance, check_tensor
from rr_megatron_compat._wire import (
    all_gather_exact,
    as_wire_bytes,
    from_wire_bytes,
    group_rank_size,
    megatron_group,
)

_DTYPE_CODES: tuple[torch.dtype, ...] = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
)


def _check_cfg(cfg: object, where: str) -> LayoutConfig:
    how = "rr_megatron_compat.layout_config(tc) from a Megatron config"
    return check_instance(
        cfg, LayoutConfig, LayoutError, f"{where} takes an rr_core.LayoutConfig ({how})"
    )


def _check_block(value: object, what: str, ndim: int) -> torch.Tensor:
    return check_tensor(value, what, LayoutError, ndim=ndim, integer=True)


def _vp_stages(cfg: LayoutConfig) -> list[int | None]:
    return list(range(cfg.vp_size)) if cfg.vp_size is not None else [None]


def rank_moe_layer_numbers(cfg: LayoutConfig, pp_rank: int) -> tuple[int, ...]:
    """Global numbers of the MoE layers a pipeline rank holds, chunk by chunk (vp_stage order)."""
    _check_cfg(cfg, "rank_moe_layer_numbers")
    return tuple(n for vp in _vp_stages(cfg) for n in stage_moe_layer_numbers(cfg, pp_rank, vp))


def stack_rank_routes(
    records: Mapping[int, torch.Tensor], cfg: LayoutConfig, pp_rank: int
) -> torch.Tensor | None:
    """One rank's records ``{layer_number: [T, K]}`` as ``[T, m, K]`` in chunk-then-layer order.

    The keys must be exactly the rank's MoE layers (whatever order they were recorded in, e.g.
    the interleaved schedule's); ``None`` for a rank without MoE layers.
    """
    if not isinstance(records, Mapping):
        raise LayoutError(
            f"stack_rank_routes takes records as {{layer_number: [T, K] ids}}; got "
            f"{type(records).__name__}"
        )
    for n, t in records.items():
        _check_block(t, f"the record of layer {n!r} ([T, K] route ids)", 2)
    expected = rank_moe_layer_numbers(cfg, pp_rank)
    if sorted(records) != sorted(expected):
        raise LayoutError(
            f"pipeline rank {pp_rank} recorded layers {sorted(records)} but the layout gives it "
            f"MoE layers {list(expected)}; check the layout (pp/vp sizes, moe_layer_freq) or "
            "that every router of every chunk recorded"
        )
    if not expected:
        return None
    return torch.stack([records[n] for n in expected], dim=-2)


def merge_stage_routes(
    blocks: Mapping[tuple[int, int | None], torch.Tensor], cfg: LayoutConfig
) -> torch.Tensor:
    """``[T, M, K]`` on the global ``moe_layers`` axis from one ``[T, m, K]`` block per virtual
    stage, keyed ``(pp_rank, vp_stage)``; each block lands at its stage's MoE ordinals (A3)."""
    _check_cfg(cfg, "merge_stage_routes")
    if not isinstance(blocks, Mapping):
        raise LayoutError(
            "merge_stage_routes takes blocks as {(pp_rank, vp_stage): [T, m, K] ids}; got "
            f"{type(blocks).__name__}"
        )
    for key, t in blocks.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise LayoutError(f"merge_stage_routes: key {key!r} is not (pp_rank, vp_stage)")
        _check_block(t, f"the block of stage {key} ([T, m, K] route ids)", 3)
    placed: list[tuple[int, torch.Tensor]] = []
    for (pp_rank, vp), block in blocks.items():
        ordinals = moe_ordinals_of_stage(cfg, pp_rank, vp)
        if block.shape[-2] != len(ordinals):
            raise LayoutError(
                f"stage (pp_rank={pp_rank}, vp_stage={vp}) has {len(ordinals)} MoE layers but its "
                f"block has shape {tuple(block.shape)}"
            )
        if ordinals:
            placed.append((ordinals[0], block))
    placed.sort(key=lambda item: item[0])
    if sum(b.shape[-2] for _, b in placed) != num_moe_layers(cfg):
        have = sorted(blocks)
        raise LayoutError(f"stage blocks {have} do not cover the {num_moe_layers(cfg)} MoE layers")
    return torch.cat([b for _, b in placed], dim=-2)


def split_rank_routes(
    routes_TmK: torch.Tensor | None, cfg: LayoutConfig, pp_rank: int
) -> dict[tuple[int, int | None], torch.Tensor]:
    """Inverse of the rank stacking: a rank's ``[T, m, K]`` block per virtual stage."""
    _check_cfg(cfg, "split_rank_routes")
    if routes_TmK is not None:
        _check_block(routes_TmK, "routes_TmK ([T, m, K] route ids)", 3)
    counts = [len(moe_ordinals_of_stage(cfg, pp_rank, vp)) for vp in _vp_stages(cfg)]
    if routes_TmK is not None and routes_TmK.shape[-2] != sum(counts):
        raise LayoutError(
            f"routes_TmK has shape {tuple(routes_TmK.shape)}: pipeline rank {pp_rank} holds "
            f"{sum(counts)} MoE layers (dim -2 of [T, m, K]), not {routes_TmK.shape[-2]}"
        )
    out: dict[tuple[int, int | None], torch.Tensor] = {}
    start = 0
    for vp in _vp_stages(cfg):
        n = len(moe_ordinals_of_stage(cfg, pp_rank, vp))
        if n:
            if routes_TmK is None:
                raise LayoutError(
                    f"pipeline rank {pp_rank} holds MoE layers but routes_TmK is None"
                )
            out[(pp_rank, vp)] = routes_TmK.narrow(-2, start, n)
            start += n
    return out


def pp_gather(
    routes_TmK: torch.Tensor | None,
    cfg: LayoutConfig,
    group: Any = None,
    *,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Every pipeline rank's routes on the global ``moe_layers`` axis: ``[T, M, K]`` on all ranks.

    ``routes_TmK`` is this rank's :func:`stack_rank_routes` (``None`` on a rank without MoE
    layers, which still must call this: A6). ``group`` defaults to Megatron's pipeline group,
    whose rank order is the pipeline rank. The result keeps the payload's dtype unless ``dtype``.
    """
    _check_cfg(cfg, "pp_gather")
    if routes_TmK is not None:
        _check_block(routes_TmK, "routes_TmK ([T, m, K] route ids)", 3)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or dtype.is_floating_point):
        raise LayoutError(
            f"pp_gather(dtype=...) must be None or an integer torch.dtype; got {dtype!r}"
        )
    group = megatron_group("pipeline_model_parallel") if group is None else group
    pp_rank, pp_size = group_rank_size(group)
    if pp_size != cfg.pp_size:
        raise LayoutError(
            f"the pipeline group has {pp_size} ranks but the layout pp_size={cfg.pp_size}"
        )
    mine = len(rank_moe_layer_numbers(cfg, pp_rank))
    header = _header(routes_TmK, mine, pp_rank)
    headers = [h.tolist() for h in all_gather_exact(header, group)]
    T, K, code = _agree(headers, cfg)
    payload_dtype = _DTYPE_CODES[code]
    counts = [len(rank_moe_layer_numbers(cfg, r)) for r in range(pp_size)]
    width = max(counts) * T * K * payload_dtype.itemsize
    buf = torch.zeros(width, dtype=torch.uint8)
    if routes_TmK is not None and mine:
        data = as_wire_bytes(routes_TmK.to(payload_dtype))
        buf[: data.numel()] = data
    blocks: dict[tuple[int, int | None], torch.Tensor] = {}
    for rank, part in enumerate(all_gather_exact(buf, group)):
        n = counts[rank] * T * K * payload_dtype.itemsize
        rank_TmK = from_wire_bytes(part[:n].clone(), payload_dtype, (T, counts[rank], K))
        blocks.update(split_rank_routes(rank_TmK, cfg, rank))
    merged = merge_stage_routes(blocks, cfg)
    return merged if dtype is None else merged.to(dtype)


def _header(routes_TmK: torch.Tensor | None, mine: int, pp_rank: int) -> torch.Tensor:
    if routes_TmK is None:
        if mine:
            raise LayoutError(
                f"pipeline rank {pp_rank} holds {mine} MoE layers but passed no routes"
            )
        return torch.tensor([-1, -1, -1, 0], dtype=torch.int64)
    if routes_TmK.dim() != 3 or routes_TmK.dtype not in _DTYPE_CODES:
        raise LayoutError(
            f"pipeline rank {pp_rank}: routes must be an integer [T, m, K] tensor; got "
            f"{routes_TmK.dtype} {tuple(routes_TmK.shape)}"
        )
    T, m, K = routes_TmK.shape
    return torch.tensor([T, K, _DTYPE_CODES.index(routes_TmK.dtype), m], dtype=torch.int64)


def _agree(headers: Sequence[list[int]], cfg: LayoutConfig) -> tuple[int, int, int]:
    """(T, K, dtype code) all ranks agree on, or the same error on every rank."""
    known = {(t, k, c) for t, k, c, _ in headers if t >= 0}
    for rank, (t, _, _, m) in enumerate(headers):
        expected = len(rank_moe_layer_numbers(cfg, rank))
        if t >= 0 and m != expected:
            raise LayoutError(
                f"pipeline rank {rank} sent {m} MoE layers but the layout gives it {expected}"
            )
    if len(known) != 1:
        raise LayoutError(
            "pipeline ranks disagree on (tokens, top-k, dtype) of their routes: "
            f"{[tuple(h[:3]) for h in headers]} (ranks without MoE layers send -1); record the "
            "same micro-batch with the same dtype on every stage"
        )
    ((T, K, code),) = known
    return T, K, code
