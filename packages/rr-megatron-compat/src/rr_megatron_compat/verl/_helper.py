"""Which routers a call addresses: a model's own (walked), or this stage's attached ones by
layer number (see :mod:`rr_megatron_compat.verl`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn

from rr_core import ReplayError, stage_layer_numbers
from rr_megatron_compat._checks import check_model
from rr_megatron_compat._layout import layout_config
from rr_megatron_compat.verl._chunk import attached_views, chunks_of
from rr_megatron_compat.verl._layers import current_pipeline_rank
from rr_megatron_compat.verl._views import RouterReplay, RouterReplayAction

Model = nn.Module | Sequence[nn.Module]


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
