"""Layer layout and token layout under verl's function names (see :mod:`rr_megatron_compat.verl`).

Layer arithmetic is rr-core's (:func:`layout_config` of the Megatron config); token rows follow
verl's packed order: each sequence's valid tokens one after another, padded at its end to the
sequence/context-parallel alignment, split over context-parallel ranks (zigzag) and over
sequence-parallel ranks. Megatron is imported only by the functions that need its parallel state.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import rr_core
from rr_core import AlignmentError, LayoutConfig, LayoutError
from rr_megatron_compat._checks import as_index, check_tensor
from rr_megatron_compat._guards import ReplayConfigError
from rr_megatron_compat._layout import current_pipeline_rank, layout_config
from rr_megatron_compat._pipeline import pp_gather as _rr_pp_gather
from rr_megatron_compat._tokens import sp_alignment, sp_gather, sp_scatter, thd_cp_index, thd_pack
from rr_megatron_compat._wire import all_gather_exact, megatron_group


def offsets(jagged: torch.Tensor) -> torch.Tensor:
    """The row offsets of a jagged (nested) tensor."""
    result: torch.Tensor = jagged.offsets()  # type: ignore[attr-defined]
    return result


def _vp(cfg: LayoutConfig, vp_stage: int | None) -> int | None:
    if vp_stage is not None:
        vp_stage = as_index(vp_stage, "vp_stage", LayoutError)
    if cfg.vp_size is None:
        if vp_stage not in (None, 0):
            raise LayoutError(f"vp_stage={vp_stage} given but the config has no virtual pipeline")
        return None
    return 0 if vp_stage is None else vp_stage


def _pp(pp_rank: int | None) -> int:
    return current_pipeline_rank() if pp_rank is None else pp_rank


def get_num_layers_to_build(
    config: Any, vp_stage: int | None = None, pp_rank: int | None = None
) -> int:
    """Decoder layers of one (pipeline rank, virtual stage); rr-core's ``num_layers_to_build``."""
    cfg = layout_config(config)
    return rr_core.num_layers_to_build(cfg, _pp(pp_rank), _vp(cfg, vp_stage))


def is_moe_layer(tf_config: Any, layer_idx: int) -> bool:
    """Whether the 0-based decoder layer ``layer_idx`` is MoE (out of range raises)."""
    idx = as_index(layer_idx, "layer_idx", LayoutError)
    return rr_core.is_moe_layer(layout_config(tf_config), idx + 1)


def get_moe_num_layers_to_build(
    config: Any, vp_stage: int | None = None, pp_rank: int | None = None
) -> int:
    """MoE layers of one (pipeline rank, virtual stage)."""
    cfg = layout_config(config)
    return len(rr_core.stage_moe_layer_numbers(cfg, _pp(pp_rank), _vp(cfg, vp_stage)))


def get_current_rank_layer_info(tf_config: Any, vp_rank: int | None = None) -> dict[str, int]:
    """``{"start", "end", "count"}``: 0-based decoder layer range of this rank's virtual stage."""
    cfg = layout_config(tf_config)
    pp, vp = current_pipeline_rank(), _vp(cfg, vp_rank)
    start = rr_core.layer_offset(cfg, pp, vp)
    count = rr_core.num_layers_to_build(cfg, pp, vp)
    return {"start": start, "end": start + count, "count": count}


def route_layer_numbers(tf_config: Any, num_slots: int) -> tuple[int, ...]:
    """Global layer numbers of a route tensor's layer axis: all decoder layers when it has
    ``num_layers`` slots, else the MoE layers; any other width raises."""
    cfg = layout_config(tf_config)
    if num_slots == cfg.num_layers:
        return tuple(range(1, cfg.num_layers + 1))
    moe = rr_core.moe_layer_numbers(cfg)
    if num_slots == len(moe):
        return moe
    raise LayoutError(
        f"routes have {num_slots} layer slots; expected num_layers={cfg.num_layers} (all layers) "
        f"or {len(moe)} (MoE layers only)"
    )


# -- pipeline ---------------------------------------------------------------------------------


def _flat(routes: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """``[B, S|j, L, K]`` (dense or jagged) as ``[T, L, K]`` and a function putting it back."""
    if routes.is_nested:
        rows_at = offsets(routes)
        return routes.values(), lambda v: torch.nested.nested_tensor_from_jagged(v, rows_at)
    B, S, _, K = routes.shape
    return routes.reshape(B * S, -1, K), lambda v: v.reshape(B, S, -1, K)


def pp_gather(local_layers_router_map: torch.Tensor, tf_config: Any) -> torch.Tensor:
    """``[B, S, m, K]`` of this pipeline rank (chunk-then-layer order) to ``[B, S, M, K]`` on
    the global MoE-layer axis on every rank, with rr's exact :func:`~rr_megatron_compat.pp_gather`
    (the layout checks each rank's layer count; narrow dtypes travel unwidened). On CPU."""
    cfg = layout_config(tf_config)
    check_tensor(
        local_layers_router_map,
        "local_layers_router_map ([B, S, m, K] route ids)",
        LayoutError,
        ndim=4,
        integer=True,
    )
    if cfg.pp_size <= 1:
        return local_layers_router_map
    flat, back = _flat(local_layers_router_map.cpu())
    gathered: torch.Tensor = back(_rr_pp_gather(flat if flat.shape[1] else None, cfg))
    return gathered.cpu()


def reorder_and_merge_vpp_layers(
    micro_batch_tensor_list: Sequence[torch.Tensor],
    num_microbatches: int,
    vpp_size: int,
    microbatch_group_size_per_vp_stage: int,
) -> torch.Tensor:
    """Records captured in the interleaved schedule's order to ``[B, S, m, K]``: micro-batches
    concatenated per chunk, chunks concatenated on the layer axis. A missing or extra capture
    raises."""
    if isinstance(micro_batch_tensor_list, torch.Tensor) or not isinstance(
        micro_batch_tensor_list, Sequence
    ):
        raise LayoutError(
            "reorder_and_merge_vpp_layers takes the list of captured tensors; got "
            f"{type(micro_batch_tensor_list).__name__}"
        )
    for name, value in (
        ("num_microbatches", num_microbatches),
        ("vpp_size", vpp_size),
        ("microbatch_group_size_per_vp_stage", microbatch_group_size_per_vp_stage),
    ):
        if as_index(value, name, LayoutError) < 1:
            raise LayoutError(f"{name} must be >= 1; got {value}")
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    table = schedules.get_schedule_table(
        num_microbatches, vpp_size, microbatch_group_size_per_vp_stage
    )
    if len(micro_batch_tensor_list) != len(table):
        raise LayoutError(
            f"{len(micro_batch_tensor_list)} records for {len(table)} scheduled "
            f"(micro-batch, chunk) forwards; every chunk of every micro-batch must record"
        )
    by_chunk: list[dict[int, torch.Tensor]] = [{} for _ in range(vpp_size)]
    for tensor, (mb, chunk) in zip(micro_batch_tensor_list, table, strict=True):
        by_chunk[chunk][mb] = tensor
    merged = [_cat_batch([c[mb] for mb in range(num_microbatches)]) for c in by_chunk]
    if merged[0].is_nested:
        parts = [torch.cat(seqs, dim=1) for seqs in zip(*(m.unbind() for m in merged), strict=True)]
        return torch.nested.as_nested_tensor(parts, layout=torch.jagged)
    return torch.cat(merged, dim=2)


def _cat_batch(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].is_nested:
        seqs = [s for t in tensors for s in t.unbind()]
        return torch.nested.as_nested_tensor(seqs, layout=torch.jagged)
    return torch.cat(tensors, dim=0)


# -- R3 ----------------------------------------------------------------------------------------


def align_r3_router_replay_data(
    layers_topk_idx: torch.Tensor, input_ids: torch.Tensor
) -> torch.Tensor:
    """Engine routes (jagged ``[B, j, L, K]``) on the training inputs' rows: ``j`` must be the
    input length or one less (the last sampled token was never fed back); the missing row is a
    zero placeholder the replay mask leaves native."""
    check_tensor(
        layers_topk_idx,
        "layers_topk_idx (jagged [B, j, L, K] ids)",
        AlignmentError,
        ndim=4,
        integer=True,
    )
    check_tensor(input_ids, "input_ids (jagged [B, j])", AlignmentError, ndim=2)
    if not (layers_topk_idx.is_nested and input_ids.is_nested):
        raise AlignmentError("R3 alignment takes jagged (nested) routes and input_ids")
    route_at, input_at = offsets(layers_topk_idx).cpu(), offsets(input_ids).cpu()
    if route_at.numel() != input_at.numel():
        raise AlignmentError(
            f"{route_at.numel() - 1} route sequences for {input_at.numel() - 1} input sequences"
        )
    route_lens, input_lens = route_at.diff(), input_at.diff()
    short = input_lens - route_lens
    bad = ((short < 0) | (short > 1)).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        raise AlignmentError(
            f"sample {b}: {int(route_lens[b])} route rows for {int(input_lens[b])} input tokens; "
            "expected equal lengths or exactly one missing final route"
        )
    values = layers_topk_idx.values()
    if not bool(short.any()):
        return torch.nested.nested_tensor_from_jagged(values, input_at.to(values.device))
    aligned = values.new_empty((int(input_at[-1]), *values.shape[1:]))
    route_starts, input_starts = route_at.tolist(), input_at.tolist()
    for b in range(len(input_starts) - 1):  # one slice copy per sequence, one zero row or none
        start, stop = route_starts[b], route_starts[b + 1]
        to = input_starts[b] + stop - start
        aligned[input_starts[b] : to] = values[start:stop]
        aligned[to : input_starts[b + 1]] = 0
    return torch.nested.nested_tensor_from_jagged(aligned, input_at.to(values.device))


def build_r3_replay_mask(input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Jagged bool mask on ``input_ids``' rows: every row of a sequence with a response except
    its last (:func:`rr_core.replay_mask_for_lengths`: the engine routed no last sampled
    token); sequences without a response stay native."""
    check_tensor(input_ids, "input_ids (jagged [B, j])", AlignmentError, ndim=2)
    check_tensor(response_mask, "response_mask ([B, R])", AlignmentError, ndim=2)
    if not input_ids.is_nested:
        raise AlignmentError("build_r3_replay_mask takes jagged (nested) input_ids")
    starts = offsets(input_ids)
    lengths = starts.diff()
    mask = rr_core.replay_mask_for_lengths(lengths, missing_last=True)
    mask &= torch.repeat_interleave((response_mask.sum(dim=-1) > 0).to(mask.device), lengths)
    return torch.nested.nested_tensor_from_jagged(mask, starts)


# -- token rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Parallel:
    tp: int
    tp_rank: int
    cp: int
    cp_rank: int
    cp_group: Any
    sp: bool

    @property
    def align(self) -> int:
        # verl's THD packing pads each sequence to tp * cp (x2 for zigzag CP), SP or not
        return sp_alignment(self.tp, self.cp)


def _parallel(tf_config: Any, local_cp_size: int | None) -> _Parallel:
    if getattr(tf_config, "fp8", None) in ("e4m3", "hybrid"):
        raise ReplayConfigError("fp8 row padding is not supported by rr's verl layer")
    ps = importlib.import_module("megatron.core.parallel_state")
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    if local_cp_size is None:
        cp, cp_rank, group = (
            ps.get_context_parallel_world_size(),
            ps.get_context_parallel_rank(),
            None,
        )
    else:
        group = _dynamic_cp_group(ps, local_cp_size)
        cp, cp_rank = local_cp_size, torch.distributed.get_rank(group=group)
    sp = bool(getattr(tf_config, "sequence_parallel", False)) and tp > 1
    return _Parallel(tp, tp_rank, cp, cp_rank, group, sp)


def _dynamic_cp_group(ps: Any, local_cp_size: int) -> Any:
    """The context-parallel group of this micro-batch under dynamic CP (verl 0.9.1 takes it
    from Megatron's ``get_dynamic_data_context_parallel_groups``)."""
    groups = getattr(ps, "get_dynamic_data_context_parallel_groups", None)
    if groups is None:
        from rr_megatron_compat._versions import megatron_line

        raise ReplayConfigError(
            f"local_cp_size={local_cp_size} (dynamic context parallelism) needs "
            "megatron.core.parallel_state.get_dynamic_data_context_parallel_groups, which "
            f"megatron-core {megatron_line().version} does not have"
        )
    group = groups(group_size=local_cp_size)
    size = torch.distributed.get_world_size(group=group)
    if size != local_cp_size:
        raise ReplayConfigError(
            f"the dynamic CP group of local_cp_size={local_cp_size} has {size} ranks"
        )
    return group


def _rows_and_masks(
    routes: torch.Tensor,
    replay_mask: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    seqs = sequences(routes, attention_mask, "routes")
    masks = None
    if replay_mask is not None:
        masks = [m.bool() for m in sequences(replay_mask, attention_mask, "replay_mask")]
    return seqs, masks


def sequences(
    batch: torch.Tensor, attention_mask: torch.Tensor | None, what: str
) -> list[torch.Tensor]:
    """Per-sequence valid rows of a jagged tensor, or of a dense ``[B, S, ...]`` one under a
    ``[B, S]`` attention mask."""
    if batch.is_nested:
        return list(batch.unbind())
    if attention_mask is None:
        raise AlignmentError(f"dense {what} need attention_mask [B, S]")
    keep = attention_mask.bool().to(batch.device)
    if keep.shape != batch.shape[:2]:
        raise AlignmentError(f"attention_mask {tuple(keep.shape)} does not fit {what}")
    return [batch[b][keep[b]] for b in range(batch.shape[0])]


def to_router_rows(
    routes: torch.Tensor,
    replay_mask: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    tf_config: Any,
    local_cp_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's router rows ``[T, L, K]`` and replay mask (``None``: replay every row) for
    routes ``[B, S|j, L, K]`` (dense under ``attention_mask``, or jagged)."""
    par = _parallel(tf_config, local_cp_size)
    if routes.is_nested and par.cp == 1 and not par.sp and _aligned(routes, par.align):
        # the packed rows are the jagged values themselves: no copy
        rows = routes.values()
        mask = None if replay_mask is None else replay_mask.values().bool()
        if mask is not None and mask.shape != rows.shape[:1]:
            raise AlignmentError(f"replay_mask has {mask.shape[0]} rows for {rows.shape[0]} routes")
        return rows, None if mask is None or bool(mask.all()) else mask
    seqs, masks = _rows_and_masks(routes, replay_mask, attention_mask)
    packed = thd_pack(seqs, masks, align=par.align)
    rows, mask = packed.rows_TLK, packed.mask_T
    if par.cp > 1:
        index = thd_cp_index(packed.cu_seqlens_padded, par.cp_rank, par.cp)
        rows, mask = rows[index], mask[index]
    if par.sp:
        rows, mask = sp_scatter(rows, par.tp_rank, par.tp), sp_scatter(mask, par.tp_rank, par.tp)
    return rows, None if bool(mask.all()) else mask


def _aligned(jagged: torch.Tensor, align: int) -> bool:
    return align == 1 or not bool((offsets(jagged).diff() % align).any())


def from_router_rows(
    rows: torch.Tensor, lengths: list[int], tf_config: Any, local_cp_size: int | None
) -> torch.Tensor:
    """Inverse of :func:`to_router_rows` for recorded rows: the valid rows of every sequence,
    concatenated ``[sum(lengths), L, K]``."""
    par = _parallel(tf_config, local_cp_size)
    if par.sp:
        rows = sp_gather(rows)
    padded = [n + (-n % par.align) for n in lengths]
    if par.cp > 1:
        group = par.cp_group if par.cp_group is not None else megatron_group("context_parallel")
        cu = torch.tensor([0, *padded]).cumsum(0)
        full = rows.new_zeros((sum(padded), *rows.shape[1:]))
        for rank, part in enumerate(all_gather_exact(rows.contiguous(), group)):
            full[thd_cp_index(cu, rank, par.cp)] = part
        rows = full
    if rows.shape[0] != sum(padded):
        raise AlignmentError(
            f"routers saw {rows.shape[0]} rows but the batch packs to {sum(padded)}; record the "
            "micro-batch the forward ran on"
        )
    if padded == lengths:
        return rows
    starts = torch.tensor([0, *padded[:-1]]).cumsum(0)
    keep = torch.cat(
        [torch.arange(s, s + n) for s, n in zip(starts.tolist(), lengths, strict=True)]
    )
    return rows[keep]
