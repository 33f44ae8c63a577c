"""replay_forward_step: Megatron's own schedule, driven as a user writes it, runs each forward
(and its recompute in backward) as its micro-batch."""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch
from torch import nn

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, capture_maps, inputs, map_of, random_targets
from rr_core import ReplayController, ReplayError, ReplayMode


def _loss(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = output.float().mean()
    return loss, {"lm loss": loss.detach()}


def user_forward_step(data_iterator: Iterator[Mapping[str, torch.Tensor]], model: nn.Module) -> Any:
    data = next(data_iterator)
    output = model(
        data["input_ids"], data["position_ids"], attention_mask=None, labels=data["labels"]
    )
    return output, _loss


def run_schedule(
    model: nn.Module,
    batches: Sequence[Mapping[str, torch.Tensor]],
    controller: ReplayController,
    ids: Sequence[Hashable] | None = None,
) -> None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = batches[0]["input_ids"].shape
    get_forward_backward_func()(
        forward_step_func=rmc.replay_forward_step(controller, user_forward_step, microbatches=ids),
        data_iterator=iter(batches),
        model=model,
        num_microbatches=len(batches),
        seq_length=seq,
        micro_batch_size=batch,
    )


def armed(model: nn.Module, ids: Sequence[Hashable]) -> tuple[ReplayController, list[Any]]:
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model)
    layers = controller.layer_numbers
    controller.set_mode(ReplayMode.REPLAY)
    targets = [random_targets(16, len(layers), seed=i) for i in range(len(ids))]
    for mb, routes in zip(ids, targets, strict=True):
        controller.arm(mb, routes, layer_numbers=layers)
    return controller, targets


@pytest.mark.parametrize("ids", [None, ("first", "second", "third")])
def test_each_forward_and_its_recompute_replay_their_own_microbatch(
    megatron: None, ids: tuple[str, ...] | None
) -> None:
    model = build(recompute=True)
    keys: Sequence[Hashable] = range(3) if ids is None else ids
    controller, targets = armed(model, keys)
    with capture_maps(model) as maps:
        # three micro-batches ran forward before the last backward: only the tracked output
        # tells the recompute which one it belongs to
        run_schedule(model, inputs(3), controller, ids)
    report = controller.end_step()  # strict: every armed target was used, none left over
    assert report.replayed_microbatches == tuple(keys)
    for slot, layer in enumerate(controller.layer_numbers):
        for mb in range(3):
            assert torch.equal(maps[layer][mb], map_of(targets[mb][:, slot])), (layer, mb)
    controller.detach()


def test_a_forward_beyond_the_given_ids_is_refused(megatron: None) -> None:
    model = build()
    controller, _ = armed(model, ["only"])
    with pytest.raises(ReplayError, match=r"forward 2 of a model chunk.*given for 1"):
        run_schedule(model, inputs(2), controller, ["only"])
    controller.detach()


def test_the_wrapper_keeps_the_signature_megatron_inspects() -> None:
    def step_with_checkpointing(
        data_iterator: Any, model: Any, checkpoint_activations_microbatch: bool | None = None
    ) -> Any:
        return None

    controller = ReplayController(num_experts=E, top_k=K)
    wrapped = rmc.replay_forward_step(controller, step_with_checkpointing)
    assert inspect.signature(wrapped) == inspect.signature(step_with_checkpointing)
    assert wrapped.__name__ == "step_with_checkpointing"


@pytest.mark.parametrize(
    ("controller", "func", "message"),
    [
        (
            object(),
            user_forward_step,
            "takes an rr_core.ReplayController as its controller; got <object",
        ),
        (ReplayController(num_experts=E, top_k=K), "step", "must be Megatron's forward step"),
    ],
)
def test_wrong_arguments_are_refused(controller: Any, func: Any, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        rmc.replay_forward_step(controller, func)
