"""Layer layout and the pipeline gather under verl's function names (see
:mod:`rr_megatron_compat.verl`).

Layer arithmetic is rr-core's (:func:`layout_config` of the Megatron config). Megatron is
imported only by the functions that need its parallel state or its schedule table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import rr_core
from rr_core import LayoutConfig, LayoutError
from rr_megatron_compat._checks import as_index, check_tensor
from rr_megatron_compat._layout import layout_config
from rr_megatron_compat._pipeline import pp_gather as _rr_pp_gather
from rr_megatron_compat._wire import all_gather_exact
from rr_megatron_compat.verl._names import NAMES


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


def current_pipeline_rank() -> int:
    """This process's pipeline rank, from the parallel state verl's module calls ``mpu``."""
    return int(NAMES.mpu.get_pipeline_model_parallel_rank())


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
    """``{"start", "end", "count"}``: 0-based decoder layer range of this rank's virtual stage
    (``get_num_layers_to_build`` and ``get_transformer_layer_offset``, as verl composes them)."""
    vp = _vp(layout_config(tf_config), vp_rank)
    count = int(NAMES.get_num_layers_to_build(tf_config, vp_stage=vp))
    start = int(NAMES.get_transformer_layer_offset(tf_config, vp_stage=vp))
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
    the global MoE-layer axis on every rank, on CPU; narrow dtypes travel unwidened.

    With a full config (``num_layers``) this is rr's exact :func:`~rr_megatron_compat.pp_gather`:
    the layout checks each rank's layer count and places virtual stages. A config with only the
    pipeline fields (``pipeline_model_parallel_size``, verl reads nothing else) gets verl's
    gather: each rank's layers in rank order, jagged maps through ``all_gather_object``; with
    virtual pipelining that order is wrong, so it raises."""
    check_tensor(
        local_layers_router_map,
        "local_layers_router_map ([B, S, m, K] route ids)",
        LayoutError,
        ndim=4,
        integer=True,
    )
    pp_size = as_index(
        getattr(tf_config, "pipeline_model_parallel_size", 1) or 1,
        "tf_config.pipeline_model_parallel_size",
        LayoutError,
    )
    if pp_size <= 1:
        return local_layers_router_map
    group = NAMES.mpu.get_pipeline_model_parallel_group()
    group = group[0] if isinstance(group, list) else group
    world = int(torch.distributed.get_world_size(group))
    if world != pp_size:
        raise LayoutError(
            f"the pipeline group has {world} ranks but pipeline_model_parallel_size={pp_size}"
        )
    if hasattr(tf_config, "num_layers"):
        cfg = layout_config(tf_config)
        flat, back = _flat(local_layers_router_map.cpu())
        gathered: torch.Tensor = back(_rr_pp_gather(flat if flat.shape[1] else None, cfg, group))
        return gathered.cpu()
    vp = getattr(tf_config, "virtual_pipeline_model_parallel_size", None)
    if vp not in (None, 1):
        raise LayoutError(
            f"pp_gather under virtual pipelining (vp_size={vp}) places each chunk's layers by "
            "the layout, which needs tf_config.num_layers (and moe_layer_freq); this config has "
            "only the pipeline fields"
        )
    return _gather_in_rank_order(local_layers_router_map, group, world)


def _gather_in_rank_order(local: torch.Tensor, group: Any, world: int) -> torch.Tensor:
    if local.is_nested:
        parts: list[Any] = [None] * world
        torch.distributed.all_gather_object(parts, local.cpu(), group)
        starts = offsets(parts[0]).cpu()
        for rank, part in enumerate(parts):
            if not torch.equal(offsets(part).cpu(), starts):
                raise LayoutError(
                    f"pipeline rank {rank} sent routes of other sequences (offsets "
                    f"{offsets(part).tolist()} vs {starts.tolist()}); record one micro-batch"
                )
        values = torch.cat([part.values().cpu() for part in parts], dim=1)
        return torch.nested.nested_tensor_from_jagged(values, starts)
    B, S, m, K = local.shape
    headers = [h.tolist() for h in all_gather_exact(torch.tensor([m, B, S, K]), group)]
    if len({tuple(h[1:]) for h in headers}) != 1:
        raise LayoutError(
            f"pipeline ranks sent route maps of different [B, S, K]: {[h[1:] for h in headers]}; "
            "record one micro-batch with one top-k on every stage"
        )
    counts = [int(h[0]) for h in headers]
    width = max(counts)
    payload = local.cpu().new_zeros((B, S, width, K))
    payload[:, :, :m] = local.cpu()
    blocks = all_gather_exact(payload, group)
    return torch.cat([b[:, :, :n] for b, n in zip(blocks, counts, strict=True)], dim=2)


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
    table = NAMES.get_schedule_table(num_microbatches, vpp_size, microbatch_group_size_per_vp_stage)
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
