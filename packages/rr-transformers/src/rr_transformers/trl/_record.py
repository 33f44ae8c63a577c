"""R2 (``use_vllm=False``): the routes of a rollout TRL generated with the trainer's own model,
recorded in the first forward of its rows and carried with them like the engine's routes.

Where the routes are recorded: TRL 1.16 runs the old-log-prob forward (``old_per_token_logps``
in ``_generate_and_score_completions``) only when generation and optimisation steps are
misaligned (``gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0``);
otherwise it skips it and trains on-policy. rr records in TRL's old-log-prob forward when it
runs (no extra cost), and otherwise runs one forward of its own (no gradient, chunked as TRL's,
through the same ``_get_per_token_logps_and_entropies``) at the end of the rollout, or before
the first forward of another model (a reference model) when that comes first. Every training
forward of those rows then replays the recorded routes.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch

from rr_core import ReplayController, RouteMeta
from rr_transformers.trl._errors import TrlReplayError
from rr_transformers.trl._rows import RowRoutes


def recorded_rows(
    controller: ReplayController,
    microbatch: int,
    layers: tuple[int, ...],
    input_ids_BS: torch.Tensor,
    attention_mask_BS: torch.Tensor,
) -> list[RowRoutes]:
    """The routes one recorded forward chunk chose, per row: one route per attended token (on
    the MoE layers' axis) and the attended tokens they were recorded for."""
    B, S = input_ids_BS.shape
    ids_TLK = controller.recorded(microbatch).cpu()
    if ids_TLK.shape[0] != B * S:
        raise TrlReplayError(
            f"the recorded forward routed {ids_TLK.shape[0]} tokens; its chunk holds {B} rows "
            f"of {S} tokens ({B * S}): the model did not route the padded batch as one"
        )
    meta = RouteMeta(
        num_experts=controller.num_experts, top_k=controller.top_k, layer_axis="moe_layers",
        layer_numbers=layers,
    )  # fmt: skip
    ids_BSLK = ids_TLK.view(B, S, *ids_TLK.shape[1:])
    rows = []
    for b in range(B):
        attended = attention_mask_BS[b].bool().cpu()
        values = ids_BSLK[b][attended].clone()
        token_ids = input_ids_BS[b].cpu()[attended]
        rows.append(
            RowRoutes(token_ids, values, torch.ones(values.shape[0], dtype=torch.bool), meta)
        )
    return rows


def record_forward(trainer: Any, output: dict[str, Any]) -> None:
    """rr's own recording forward of a rollout's rows (TRL skipped its old-log-prob forward):
    the policy as TRL would run it there, without gradient and checkpointing."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    record_rows(trainer, ids, mask, output["completion_ids"].size(1))


def record_rows(
    trainer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> None:
    args = trainer.args
    train = trainer.model.training
    size = args.per_device_train_batch_size if train else args.per_device_eval_batch_size
    grpo = importlib.import_module("trl.trainer.grpo_trainer")
    no_checkpointing = getattr(grpo, "disable_gradient_checkpointing", None)
    scope = (
        no_checkpointing(trainer.model, args.gradient_checkpointing_kwargs)
        if no_checkpointing is not None
        else contextlib.nullcontext()
    )
    with torch.no_grad(), scope:
        trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, logits_to_keep, batch_size=size
        )
