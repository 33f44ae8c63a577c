"""Staging replay targets and collecting records for one micro-batch, verl's
``set_router_replay_data`` / ``merge_router_topk_indices`` (see :mod:`rr_megatron_compat.verl`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rr_core import ReplayError
from rr_megatron_compat._checks import as_index, check_model, check_tensor
from rr_megatron_compat.verl._chunk import chunks_of
from rr_megatron_compat.verl._helper import Model
from rr_megatron_compat.verl._layers import offsets, route_layer_numbers
from rr_megatron_compat.verl._names import NAMES
from rr_megatron_compat.verl._rows import from_router_rows, to_router_rows
from rr_megatron_compat.verl._views import RouterReplay


def _check_common(
    where: str, vp_rank: object, local_cp_size: object, model: object, attention_mask: object
) -> None:
    """The arguments every staging / merging call shares (O(1): metadata only)."""
    for name, value in (("vp_rank", vp_rank), ("local_cp_size", local_cp_size)):
        if value is not None and as_index(value, f"{where}: {name}", ReplayError) < 0:
            raise ReplayError(f"{where}: {name} must be >= 0 or None; got {value}")
    if model is not None:
        check_model(model, where)
    if attention_mask is not None:
        check_tensor(attention_mask, f"{where}: attention_mask ([B, S])", ReplayError, ndim=2)


def set_router_replay_data(
    layers_topk_idx: torch.Tensor,
    attention_mask: torch.Tensor | None,
    tf_config: Any,
    vp_rank: int | None = None,
    replay_mask: torch.Tensor | None = None,
    local_cp_size: int | None = None,
    model: Model | None = None,
) -> None:
    """Stage replay targets for the next forward (one micro-batch) of ``model``'s chunk.

    ``layers_topk_idx`` is ``[B, S, L, K]`` under ``attention_mask`` ``[B, S]`` (``None``: every
    row is a token, as verl takes it), or jagged ``[B, j, L, K]``; ``L`` is ``num_layers`` (all
    layers) or the number of MoE layers, anything else raises. Rows are packed as the model runs
    them (valid tokens of each sequence, padded to the SP/CP alignment, split over CP ranks — the
    per-micro-batch ``local_cp_size`` group under dynamic CP — and over SP ranks); padding rows
    and rows outside ``replay_mask`` route natively. rr's own views keep the ids' dtype; any
    other router object gets verl's int64 per layer. Without ``model`` the routers are
    :meth:`RouterReplayHelper.get_micro_batch_router_list`'s, each placed by its layer number, or
    (an object without one) by its position among the stage's MoE layers, verl's rule.
    """
    if layers_topk_idx is None:
        raise ReplayError("set_router_replay_data needs the routes recorded or returned for them")
    check_tensor(
        layers_topk_idx,
        "set_router_replay_data: layers_topk_idx ([B, S, L, K] or jagged [B, j, L, K] ids)",
        ReplayError,
        ndim=4,
        integer=True,
    )
    if replay_mask is not None:
        check_tensor(replay_mask, "set_router_replay_data: replay_mask", ReplayError, min_ndim=1)
    _check_common("set_router_replay_data", vp_rank, local_cp_size, model, attention_mask)
    with torch.no_grad():
        rows, mask = to_router_rows(
            layers_topk_idx, replay_mask, attention_mask, tf_config, local_cp_size
        )
    layers = route_layer_numbers(tf_config, rows.shape[1])
    if model is not None:
        chunks = chunks_of(model)
        if not any(chunk.views for chunk in chunks):
            raise ReplayError("set_router_replay_data found no routers in the forwarded model")
        for chunk in chunks:
            chunk.stage_rows(rows, layers, mask)
        return
    slot = {n: i for i, n in enumerate(layers)}
    routers = NAMES.RouterReplayHelper.get_micro_batch_router_list(tf_config, vp_rank)
    for number, router in zip(_stage_layers(routers, tf_config, vp_rank), routers, strict=True):
        if number not in slot:
            raise ReplayError(
                f"set_router_replay_data: the routes' {rows.shape[1]} layer slots have no layer "
                f"{number}"
            )
        ids = rows[:, slot[number]]
        if not isinstance(router, RouterReplay):
            ids = ids.to(torch.int64)  # verl's targets, for whatever stands in for a router
        router.set_target_indices(ids, replay_mask=mask)


def _stage_layers(routers: list[Any], tf_config: Any, vp_rank: int | None) -> list[int]:
    """Each router's global layer number: its own, or verl's positional rule (the n-th router of
    the stage is its n-th MoE layer of ``get_current_rank_layer_info``'s range)."""
    if all(isinstance(r, RouterReplay) for r in routers):
        return [r.layer_number for r in routers]
    info = NAMES.get_current_rank_layer_info(tf_config, vp_rank)
    moe = [i + 1 for i in range(info["start"], info["end"]) if NAMES.is_moe_layer(tf_config, i)]
    if len(moe) != len(routers):
        raise ReplayError(
            f"{len(routers)} routers for the {len(moe)} MoE layers {moe} of this stage; routers "
            "without a layer_number are placed by position, which needs one per MoE layer"
        )
    return moe


def merge_router_topk_indices(
    attention_mask: torch.Tensor | None,
    input_ids: torch.Tensor,
    mini_layer_topk_idx_list: list[torch.Tensor],
    tf_config: Any,
    vp_rank: int | None = None,
    local_cp_size: int | None = None,
    model: Model | None = None,
) -> None:
    """Append the routes the chunk's last forward recorded, int16 on CPU: ``[B, S, m, K]``
    (zeros outside ``attention_mask``; ``None``: every row is a token) for dense inputs, jagged
    ``[B, j, m, K]`` for nested ``input_ids``; ``m`` are the chunk's MoE layers in layer order
    (``m = 0`` for a dense-only stage). Raises if any router of the chunk did not record."""
    check_tensor(
        input_ids,
        "merge_router_topk_indices: input_ids ([B, S] or jagged)",
        ReplayError,
        min_ndim=2,
    )
    if not isinstance(mini_layer_topk_idx_list, list):
        raise ReplayError(
            "merge_router_topk_indices appends to mini_layer_topk_idx_list, which must be a list; "
            f"got {type(mini_layer_topk_idx_list).__name__}"
        )
    _check_common("merge_router_topk_indices", vp_rank, local_cp_size, model, attention_mask)
    with torch.no_grad():
        rows = _recorded_rows(tf_config, vp_rank, model)
        if rows is None:
            mini_layer_topk_idx_list.append(_no_routes(input_ids, attention_mask, tf_config))
            return
        out = from_router_rows(rows, input_ids, attention_mask, tf_config, local_cp_size)
    mini_layer_topk_idx_list.append(out.cpu())


def _no_routes(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, tf_config: Any
) -> torch.Tensor:
    """The empty ``m = 0`` route map of a stage without MoE layers."""
    topk = getattr(tf_config, "moe_router_topk", None)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
        raise ReplayError(
            "merge_router_topk_indices: a stage without MoE layers returns an empty route map, "
            f"which needs tf_config.moe_router_topk > 0; got {topk!r}"
        )
    if input_ids.is_nested:
        starts = offsets(input_ids).cpu()
        empty = torch.empty((int(starts[-1]), 0, topk), dtype=torch.int16)
        return torch.nested.nested_tensor_from_jagged(empty, starts)
    shape = (attention_mask if attention_mask is not None else input_ids).shape[:2]
    return torch.empty((*shape, 0, topk), dtype=torch.int16)


def _recorded_rows(tf_config: Any, vp_rank: int | None, model: Model | None) -> Any:
    """``[T, m, K]`` the stage recorded in its last forward (None for a stage without MoE)."""
    if model is not None:
        chunks = [chunk for chunk in chunks_of(model) if chunk.views]
        if len(chunks) > 1:
            raise ReplayError(
                "merge_router_topk_indices: routers of more than one chunk; pass one chunk"
            )
        return _chunk_rows(chunks[0]) if chunks else None
    routers = NAMES.RouterReplayHelper.get_micro_batch_router_list(tf_config, vp_rank)
    if not routers:
        return None
    owners: dict[int, Any] = {}
    if all(isinstance(r, RouterReplay) for r in routers):
        owners = {id(r._chunk): r._chunk for r in routers}
    only = next(iter(owners.values())) if len(owners) == 1 else None
    if only is not None and len(only.views) == len(routers):
        return _chunk_rows(only)  # one chunk's routers, all of them: its stacked record
    recorded: list[Any] = [r.recorded_topk_idx for r in routers]
    missing = [i for i, ids in enumerate(recorded) if ids is None]
    if missing:
        raise ReplayError(
            f"merge_router_topk_indices: routers at positions {missing} of this stage's "
            f"{len(routers)} did not record in the last forward"
        )
    return torch.stack([ids.to(torch.int16) for ids in recorded], dim=1)


def _chunk_rows(chunk: Any) -> torch.Tensor:
    rows: torch.Tensor | None = chunk.recorded_last()
    if rows is None:
        raise ReplayError(
            f"merge_router_topk_indices: layers {list(chunk.layers)} did not record in the "
            "last forward"
        )
    return rows


def merge_nested_router_maps(router_maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """The micro-batches' jagged ``[b_i, j, m, K]`` route maps as one int16 jagged tensor of
    all their sequences, in order (verl's R2 merge without virtual pipelining)."""
    if isinstance(router_maps, torch.Tensor) or not isinstance(router_maps, Sequence):
        raise ReplayError(
            "merge_nested_router_maps takes a list of jagged route maps, one per micro-batch; got "
            f"{type(router_maps).__name__}"
        )
    if not router_maps:
        raise ReplayError("merge_nested_router_maps needs at least one micro-batch's routes")
    values, lengths = [], []
    for router_map in router_maps:
        check_tensor(
            router_map, "merge_nested_router_maps: each route map", ReplayError, integer=True
        )
        if not router_map.is_nested:
            raise ReplayError(
                f"merge_nested_router_maps takes jagged tensors; got {router_map.shape}"
            )
        values.append(router_map.values())
        lengths.append(offsets(router_map).diff())
    merged = torch.cat(values).to(torch.int16)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(lengths).cumsum(0)])
    return torch.nested.nested_tensor_from_jagged(merged, starts.to(merged.device))
