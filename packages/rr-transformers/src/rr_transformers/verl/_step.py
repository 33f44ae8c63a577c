"""One pass of verl's FSDP engine (``forward_backward_batch``) under replay.

The pass decides RECORD or REPLAY as verl's Megatron engine does for the same
``router_replay.mode``: R2 records in a forward-only pass whose batch has no ``routed_experts``
(``compute_log_prob``) and replays them in the update; R3 replays the rollout's routes in every
pass. Each micro-batch (verl's own ``forward_step``) is armed from its slice of the batch, or
its recorded ids are added to its ``model_output`` as ``routed_experts``, which verl's
``postprocess_batch_func`` puts back in batch order like ``log_probs``. The step ends with the
pass: ``end_step()`` raises if an armed layer never replayed, and the report is kept.
"""

from __future__ import annotations

import importlib
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from rr_core import ReplayMode, RRWarning, narrowest_dtype
from rr_transformers._routes import arm_routes, end_failed_step
from rr_transformers.verl._binding import Binding, binding_for, existing
from rr_transformers.verl._errors import VerlFSDPReplayError
from rr_transformers.verl._layout import (
    packed_position_ids,
    padded_attention_mask,
    recorded_jagged,
    route_batch,
    route_meta,
)
from rr_transformers.verl._metrics import pass_metrics
from rr_transformers.verl._mode import read_mode


@dataclass
class Pass:
    binding: Binding
    mode: str  # "R2" or "R3"
    record: bool
    microbatches: int = 0
    replayed_rows: int = 0  # rows armed with routes, over the pass's micro-batches
    seconds: float = 0.0  # time in rr's own code during the pass
    metrics: dict[str, list[float]] | None = None  # the pass's rr/ figures, once it ended

    def next_microbatch(self) -> int:
        index, self.microbatches = self.microbatches, self.microbatches + 1
        return index


_PASSES: weakref.WeakKeyDictionary[Any, Pass] = weakref.WeakKeyDictionary()
#: Engines already told that the routes they got were not replayed (said once per engine).
_TOLD_OFF: weakref.WeakSet[Any] = weakref.WeakSet()


def _tu() -> Any:
    return importlib.import_module("verl.utils.tensordict_utils")


def replay_mode(engine: Any) -> str:
    """The engine config's ``router_replay.mode`` (verl's own setting), checked."""
    return read_mode(getattr(getattr(engine, "engine_config", None), "router_replay", None))


def _say_routes_unused(engine: Any, data: Any) -> None:
    """Routes reaching a trainable engine whose replay is off are a configuration slip (the
    rollout records them for replay): said once per engine, by the setting to change. A
    forward-only engine (verl's reference policy) routes natively by design."""
    config = getattr(engine, "engine_config", None)
    if getattr(config, "forward_only", False) or engine in _TOLD_OFF:
        return
    if data.get("routed_experts", None) is None:
        return
    _TOLD_OFF.add(engine)
    warnings.warn(
        "verl's FSDP engine got routed_experts but its engine_config.router_replay.mode reads "
        f"'disabled' (router_replay={getattr(config, 'router_replay', None)!r}): rr routes "
        "natively and replays nothing. To replay the rollout's routes set "
        "+actor_rollout_ref.actor.fsdp_config.router_replay.mode=R3",
        RRWarning,
        stacklevel=4,
    )


def _check_engine(engine: Any, mode: str) -> None:
    if getattr(engine, "use_ulysses_sp", False):
        raise VerlFSDPReplayError(
            f"router_replay.mode={mode!r} with ulysses_sequence_parallel_size="
            f"{engine.ulysses_sequence_parallel_size}: rr arms whole packed micro-batches, not "
            "sequence-parallel slices; set ulysses_sequence_parallel_size=1"
        )
    if getattr(engine, "pad_to_length", False):
        raise VerlFSDPReplayError(
            f"router_replay.mode={mode!r} with pad_to_length=True: the bucket padding adds "
            "router rows no route covers (verl's Megatron engine refuses it too); set "
            "pad_to_length=False"
        )


def begin(engine: Any, data: Any, forward_only: bool) -> Pass | None:
    """The pass this call runs, or None where it routes natively (replay not configured, or
    the batch says ``enable_routing_replay=False``, as verl's worker marks a reference
    model's forward)."""
    mode = replay_mode(engine)
    flag = _tu().get_non_tensor_data(data, key="enable_routing_replay", default=None)
    if mode == "disabled" and flag is not False:
        _say_routes_unused(engine, data)
    if mode == "disabled" or flag is False:
        idle = existing(engine.module)
        if idle is not None:
            idle.controller.set_mode(ReplayMode.OFF)
        return None
    _check_engine(engine, mode)
    record = mode == "R2" and forward_only and data.get("routed_experts", None) is None
    binding = binding_for(engine.module)
    binding.controller.set_mode(ReplayMode.RECORD if record else ReplayMode.REPLAY)
    step = Pass(binding, mode, record)
    _PASSES[engine] = step
    return step


def end(engine: Any, step: Pass, *, failed: bool) -> None:
    """Close the step (targets and records cleared even when the pass raised)."""
    _PASSES.pop(engine, None)
    controller = step.binding.controller
    started = time.perf_counter()
    try:
        if failed:
            end_failed_step(controller)
        else:
            report = controller.end_step()
            step.binding.last_report = report
            step.seconds += time.perf_counter() - started
            step.metrics = pass_metrics(
                report, replayed_rows=step.replayed_rows, seconds=step.seconds
            )
    finally:
        controller.set_mode(ReplayMode.OFF)


def active(engine: Any) -> Pass | None:
    return _PASSES.get(engine)


def _uses_packing(micro_batch: Any) -> bool:
    return bool(_tu().get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True))


def arm(step: Pass, index: int, micro_batch: Any, device: torch.device) -> None:
    """Arm micro-batch ``index`` from its ``routed_experts`` in the order its routers see."""
    started = time.perf_counter()
    binding = step.binding
    routed = micro_batch.get("routed_experts", None)
    if routed is None:
        where = (
            "the rollout returns none (R3 needs the rollout's routes in the batch)"
            if step.mode == "R3"
            else "R2 replays what compute_log_prob recorded: keep its routed_experts in the "
            "batch of the update"
        )
        raise VerlFSDPReplayError(
            f"router_replay.mode={step.mode!r}: micro-batch {index} has no routed_experts; " + where
        )
    input_ids = micro_batch["input_ids"]
    controller = binding.controller
    meta = route_meta(
        routed,
        num_experts=controller.num_experts,
        top_k=controller.top_k,
        moe_layers=binding.moe_layers,
        layers=binding.num_layers,
    )
    response_mask = micro_batch["response_mask"] if step.mode == "R3" else None
    batch = route_batch(routed, input_ids, meta, response_mask=response_mask).to(device)
    if _uses_packing(micro_batch):
        position_ids = packed_position_ids(micro_batch).to(device)
        arm_routes(controller, index, batch, position_ids=position_ids)
    else:
        arm_routes(controller, index, batch, attention_mask=padded_attention_mask(input_ids))
    step.replayed_rows += int(batch.valid_N.sum())
    step.seconds += time.perf_counter() - started


def recorded(step: Pass, index: int, micro_batch: Any) -> torch.Tensor:
    """Micro-batch ``index``'s recorded ids, jagged ``[b, j, L_moe, K]`` as verl holds them
    (the narrowest dtype that holds every id: one byte per id up to 256 experts)."""
    started = time.perf_counter()
    controller = step.binding.controller
    ids = controller.recorded(index, dtype=narrowest_dtype(controller.num_experts))
    input_ids = micro_batch["input_ids"]
    mask = None if _uses_packing(micro_batch) else padded_attention_mask(input_ids)
    jagged = recorded_jagged(ids, input_ids, mask)
    step.seconds += time.perf_counter() - started
    return jagged
