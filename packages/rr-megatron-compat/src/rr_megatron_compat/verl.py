"""verl's router-replay API, backed by rr.

One line switches a verl installation, without editing verl::

    import rr_megatron_compat.verl
    rr_megatron_compat.verl.install()  # before or after verl's engine module is imported

Or a verl checkout replaces its two imports::

    from verl.utils.megatron.router_replay_patch import ...
    from verl.utils.megatron.router_replay_utils import ...

with ``from rr_megatron_compat.verl import ...``.

Names, parameters and defaults are verl's (0.9). Behind them every model chunk is driven by an
:class:`rr_core.ReplayController` attached by walking the chunk (never a process-global router
list), targets are keyed by micro-batch (never a FIFO of pops), and whatever cannot be replayed
exactly raises instead of routing natively. Importing this module imports neither megatron nor
any verl code. See the package README, "Migrating from verl", for the differences.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from rr_core import ReplayError, stage_layer_numbers
from rr_megatron_compat._checks import as_index, check_model, check_tensor
from rr_megatron_compat._layout import current_pipeline_rank, layout_config
from rr_megatron_compat._verl_install import install, is_installed, uninstall
from rr_megatron_compat._verl_layout import (
    align_r3_router_replay_data,
    build_r3_replay_mask,
    from_router_rows,
    get_current_rank_layer_info,
    get_moe_num_layers_to_build,
    get_num_layers_to_build,
    is_moe_layer,
    offsets,
    pp_gather,
    reorder_and_merge_vpp_layers,
    route_layer_numbers,
    to_router_rows,
)
from rr_megatron_compat._verl_replay import (
    RouterReplay,
    RouterReplayAction,
    attached_views,
    chunks_of,
)

__all__ = [
    "RouterReplay",
    "RouterReplayAction",
    "RouterReplayHelper",
    "align_r3_router_replay_data",
    "apply_router_replay_patch",
    "build_r3_replay_mask",
    "get_current_rank_layer_info",
    "get_moe_num_layers_to_build",
    "get_num_layers_to_build",
    "install",
    "is_installed",
    "is_moe_layer",
    "iter_model_routers",
    "merge_nested_router_maps",
    "merge_router_topk_indices",
    "pp_gather",
    "remove_router_replay_patch",
    "reorder_and_merge_vpp_layers",
    "set_model_router_replay_action",
    "set_router_replay_data",
    "uninstall",
]

Model = nn.Module | Sequence[nn.Module]


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


def apply_router_replay_patch() -> None:
    """Install rr's router hooks for the installed Megatron line, remember every ``TopKRouter``
    built from now on whose config enables replay (``RouterReplay.router_instances``), and give
    routers a ``router_replay`` on lines without a native one (idempotent). On 0.16+ build the
    model from a config with ``moe_enable_routing_replay`` (verl's engine sets it, or
    :func:`rr_megatron_compat.enable_replay`); rr adds no ``enable_routing_replay`` parameter
    to ``TransformerConfig``."""
    from rr_megatron_compat._verl_install import apply_router_patch

    apply_router_patch()


def remove_router_replay_patch() -> None:
    """rr only: detach every model used through this module, forget the routers and remove
    what :func:`apply_router_replay_patch` installed."""
    from rr_megatron_compat._verl_install import remove_router_patch

    remove_router_patch()


def __getattr__(name: str) -> Any:
    # verl's modules expose Megatron's router class; loaded on first use (no megatron import)
    if name == "TopKRouter":
        return importlib.import_module("megatron.core.transformer.moe.router").TopKRouter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def iter_model_routers(model: Model) -> Iterator[tuple[int, RouterReplay]]:
    """``(layer_number, RouterReplay)`` for each decoder router of ``model`` (a chunk or the
    list of VPP chunks), in layer order; MTP routers are never included. Attaches on first use."""
    check_model(model, "iter_model_routers")
    for chunk in chunks_of(model):
        for view in chunk.views:
            yield view.layer_number, view


def set_model_router_replay_action(model: Model, router_replay_action: RouterReplayAction) -> None:
    """Set the action on ``model``'s own routers only."""
    check_model(model, "set_model_router_replay_action")
    if router_replay_action is not None and not isinstance(
        router_replay_action, RouterReplayAction
    ):
        raise ReplayError(
            "set_model_router_replay_action takes a RouterReplayAction (RECORD, REPLAY_FORWARD, "
            f"REPLAY_BACKWARD) or None; got {router_replay_action!r}"
        )
    for chunk in chunks_of(model):
        chunk.set_action(router_replay_action)


def _local_views(tf_config: Any, vp_rank: int | None, model: Model | None) -> list[RouterReplay]:
    if model is not None:
        return [view for _, view in iter_model_routers(model)]
    return RouterReplayHelper.get_micro_batch_router_list(tf_config, vp_rank)


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

    ``layers_topk_idx`` is ``[B, S, L, K]`` under ``attention_mask`` ``[B, S]``, or jagged
    ``[B, j, L, K]``; ``L`` is ``num_layers`` (all layers) or the number of MoE layers, anything
    else raises. Rows are packed as the model runs them (valid tokens of each sequence, padded to
    the SP/CP alignment, split over CP ranks — the per-micro-batch ``local_cp_size`` group under
    dynamic CP — and over SP ranks); padding rows and rows outside ``replay_mask`` route
    natively. The ids keep their dtype (verl widens each layer to int64); they are validated
    once, when the forward arms them. Without ``model`` the routers of this stage are found by
    layer number among the attached ones (:meth:`RouterReplayHelper.get_micro_batch_router_list`).
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
    for view in RouterReplayHelper.get_micro_batch_router_list(tf_config, vp_rank):
        view.set_target_indices(rows[:, slot[view.layer_number]], replay_mask=mask)


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
    (zeros outside ``attention_mask``) for dense inputs, jagged ``[B, j, m, K]`` for nested
    ``input_ids``; ``m`` are the chunk's MoE layers in layer order (``m = 0`` for a dense-only
    stage). Raises if any router of the chunk did not record."""
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
    lengths = _lengths(input_ids, attention_mask)
    rows = _recorded_rows(tf_config, vp_rank, model)
    if rows is None:
        rows = torch.zeros((sum(lengths), 0, int(tf_config.moe_router_topk)), dtype=torch.int16)
    else:
        rows = from_router_rows(rows, lengths, tf_config, local_cp_size)
    values = rows.to(device="cpu", dtype=torch.int16)
    if input_ids.is_nested:
        starts = torch.tensor([0, *lengths]).cumsum(0)
        mini_layer_topk_idx_list.append(torch.nested.nested_tensor_from_jagged(values, starts))
        return
    assert attention_mask is not None
    keep = attention_mask.bool().cpu()
    out = torch.zeros((*keep.shape, *values.shape[1:]), dtype=torch.int16)
    out[keep] = values
    mini_layer_topk_idx_list.append(out)


def _recorded_rows(tf_config: Any, vp_rank: int | None, model: Model | None) -> Any:
    """``[T, m, K]`` the chunk recorded in its last forward (None for a stage without MoE)."""
    if model is not None:
        chunks = [chunk for chunk in chunks_of(model) if chunk.views]
    else:
        views = RouterReplayHelper.get_micro_batch_router_list(tf_config, vp_rank)
        chunks = list({id(v._chunk): v._chunk for v in views if v._chunk is not None}.values())
        if len(chunks) == 1 and len(views) != len(chunks[0].views):
            raise ReplayError("merge_router_topk_indices: pass model= to address its routers")
    if not chunks:
        return None
    if len(chunks) != 1:
        raise ReplayError("merge_router_topk_indices: routers of more than one chunk; pass model=")
    rows = chunks[0].recorded_last()
    if rows is None:
        raise ReplayError(
            f"merge_router_topk_indices: layers {list(chunks[0].layers)} did not record in the "
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


def _lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int]:
    if input_ids.is_nested:
        return [int(n) for n in offsets(input_ids).diff().tolist()]
    if attention_mask is None:
        raise ReplayError("dense inputs need attention_mask [B, S]")
    return [int(n) for n in attention_mask.bool().sum(dim=-1).tolist()]


class RouterReplayHelper:
    """Queries on the routers of one stage or model."""

    @staticmethod
    def get_micro_batch_router_list(
        tf_config: Any, vp_rank: int | None = None
    ) -> list[RouterReplay]:
        """Attached routers whose layer belongs to this rank's virtual stage ``vp_rank``, chosen
        by layer number (not by position); two attached routers on one layer raise: pass
        ``model=`` to the caller instead."""
        cfg = layout_config(tf_config)
        vp = None if cfg.vp_size is None else (vp_rank or 0)
        layers = set(stage_layer_numbers(cfg, current_pipeline_rank(), vp))
        chosen = [v for v in attached_views() if v.layer_number in layers]
        numbers = [v.layer_number for v in chosen]
        if len(numbers) != len(set(numbers)):
            raise ReplayError(
                f"more than one attached model has routers on layers {sorted(numbers)}; pass "
                "the forwarded model (model=...) to address its routers"
            )
        return sorted(chosen, key=lambda v: v.layer_number)

    @staticmethod
    def _get_action_router_list(
        tf_config: Any, vp_rank: int | None = None, model: Model | None = None
    ) -> list[RouterReplay]:
        return _local_views(tf_config, vp_rank, model)

    @staticmethod
    def _is(action: RouterReplayAction, tf_config: Any, vp_rank: Any, model: Any) -> bool:
        if model is not None:
            shared = {chunk.action() for chunk in chunks_of(model) if chunk.views}
        else:
            shared = {v.router_replay_action for v in _local_views(tf_config, vp_rank, None)}
        if "mixed" in shared or len(shared) > 1:
            raise ReplayError(f"routers of one stage disagree on the action: {shared}")
        return shared == {action}

    @staticmethod
    def is_r2_record_action(
        tf_config: Any, vp_rank: int | None = None, model: Model | None = None
    ) -> bool:
        """Whether the stage's routers are in RECORD (mixed actions raise)."""
        return RouterReplayHelper._is(RouterReplayAction.RECORD, tf_config, vp_rank, model)

    @staticmethod
    def is_replay_forward_action(
        tf_config: Any, vp_rank: int | None = None, model: Model | None = None
    ) -> bool:
        """Whether the stage's routers are in REPLAY_FORWARD (mixed actions raise)."""
        return RouterReplayHelper._is(RouterReplayAction.REPLAY_FORWARD, tf_config, vp_rank, model)

    @staticmethod
    def is_replay_backward_action(
        tf_config: Any, vp_rank: int | None = None, model: Model | None = None
    ) -> bool:
        """Whether the stage's routers are in REPLAY_BACKWARD (mixed actions raise)."""
        return RouterReplayHelper._is(RouterReplayAction.REPLAY_BACKWARD, tf_config, vp_rank, model)
