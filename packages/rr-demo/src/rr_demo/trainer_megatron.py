"""The Megatron trainer: a real megatron-core ``GPTModel`` on CPU (rr_fakes' harness builds
it, or loads the real engine's checkpoint into it), replayed as a Megatron user replays:
``rr_megatron_compat.install`` and ``attach``, the engine's routes armed in the routers' row
order (``batch_to_router_rows``: ``[S, B]`` flattened), and the training step driven through
Megatron's own ``forward_backward_func`` with the forward step wrapped by
``rr_megatron_compat.replay_forward_step`` (each forward inside its micro-batch, its output
tracked for the recompute). Expert use is read from the routers' routing maps.

Shapes: B sequences, S padded length, L layer slots, K top-k, E experts, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayMode
from rr_demo.chain import Padded
from rr_demo.config import DemoConfig, Progress


@contextmanager
def open_trainer(
    cfg: DemoConfig, progress: Progress, checkpoint: Any = None
) -> Iterator[MegatronTrainer]:
    """Build the model inside Megatron's parallel state with rr's hooks installed: the config's
    random GPTModel, or ``checkpoint`` (an ``rr_fakes.shims.hf_checkpoints.HFCheckpoint``) loaded
    through ``rr_fakes.hf_to_megatron``."""
    import rr_megatron_compat as rmc
    from rr_fakes.shims.megatron import RECOMPUTE, TinyGPTConfig, build_gpt, model_parallel

    with model_parallel(seed=cfg.seed):
        rmc.install()
        try:
            extra = {**RECOMPUTE, **rmc.replay_config_fields()}
            if checkpoint is not None:
                from rr_fakes.hf_to_megatron import build_hf_gpt

                progress(f"load the {checkpoint.family} checkpoint into a real Megatron GPTModel")
                model, spec = build_hf_gpt(checkpoint.path, extra=extra)
                yield MegatronTrainer(
                    model, spec.num_experts, spec.top_k, spec.gpt.vocab_size, spec.gpt.num_layers
                )
                return
            progress("build a real Megatron GPTModel")
            model = build_gpt(
                TinyGPTConfig(
                    num_layers=cfg.num_layers,
                    hidden_size=cfg.hidden_size,
                    num_attention_heads=4,
                    ffn_hidden_size=2 * cfg.hidden_size,
                    num_experts=cfg.num_experts,
                    top_k=cfg.top_k,
                    moe_layer_freq=cfg.moe_layer_freq,
                    vocab_size=cfg.vocab_size,
                    max_sequence_length=cfg.prompt_length + cfg.new_tokens + 1,
                    extra=extra,
                )
            )
            model.eval()
            yield MegatronTrainer(model, cfg.num_experts, cfg.top_k, cfg.vocab_size, cfg.num_layers)
        finally:
            rmc.uninstall()


@dataclass
class MegatronTrainer:
    model: nn.Module
    num_experts: int
    top_k: int
    vocab_size: int
    num_layers: int

    def forward(self, model: nn.Module, ids_BS: torch.Tensor) -> torch.Tensor:
        positions_BS = torch.arange(ids_BS.shape[1]).expand_as(ids_BS)
        out: torch.Tensor = model(ids_BS, positions_BS, attention_mask=None)
        return out  # [B, S, V]

    def attach_recorder(self, recorder: ReplayController, model: nn.Module) -> tuple[int, ...]:
        return recorder.attach(model)  # Megatron's layers carry their layer_number

    def versions(self) -> dict[str, str]:
        return {"megatron_core_version": version("megatron-core")}

    def _controller(self) -> ReplayController:
        from rr_megatron_compat import attach

        controller = ReplayController(num_experts=self.num_experts, top_k=self.top_k)
        attach(controller, self.model)
        return controller

    def trainer_forward(
        self, padded: Padded, *, replay: bool
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        from rr_fakes.shims.megatron import route_log

        controller = self._controller()
        try:
            if replay:
                _arm_rollout(controller, padded)
            with torch.no_grad(), route_log(self.model) as log, controller.microbatch(0):
                logits_BSV = self.forward(self.model, padded.ids_BS)
            controller.end_step()
        finally:
            controller.detach()
        B, S = padded.ids_BS.shape
        used = {  # the last forward's routing map [S * B, E] of each decoder router
            layer: maps[-1].reshape(S, B, -1).transpose(0, 1) for layer, maps in log.forward.items()
        }
        return used, logits_BSV

    def train_step(self, padded: Padded) -> float:
        """Forward + backward through Megatron's schedule with activation recompute; the
        mean token loss."""
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

        from rr_megatron_compat import replay_forward_step

        ids_BS = padded.ids_BS
        microbatch = {
            "input_ids": ids_BS,
            "position_ids": torch.arange(ids_BS.shape[1]).expand_as(ids_BS),
            "labels": torch.roll(ids_BS, -1, dims=1),
        }
        self.model.train()
        controller = self._controller()
        try:
            _arm_rollout(controller, padded)
            (losses,) = get_forward_backward_func()(
                forward_step_func=replay_forward_step(controller, _forward_step),
                data_iterator=iter([microbatch]),
                model=self.model,
                num_microbatches=1,
                seq_length=ids_BS.shape[1],
                micro_batch_size=ids_BS.shape[0],
                forward_only=False,
            )
            controller.end_step()
        finally:
            controller.detach()
            self.model.eval()
        return float(losses["lm loss"])


def _forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: nn.Module) -> Any:
    """Megatron's forward step: the model's per-token loss ``[B, S]`` and how to reduce it."""
    data = next(data_iterator)
    output_BS = model(
        data["input_ids"], data["position_ids"], attention_mask=None, labels=data["labels"]
    )
    return output_BS, _mean_loss


def _mean_loss(output_BS: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = output_BS.float().mean()
    return loss, {"lm loss": loss.detach()}


def _arm_rollout(controller: ReplayController, padded: Padded) -> None:
    """R3: replay the captured routes in the router's row order ([S, B] flattened); rows
    without a route (the last token, padding) route natively."""
    from rr_megatron_compat import batch_to_router_rows

    controller.set_mode(ReplayMode.REPLAY)
    controller.arm(
        0,
        batch_to_router_rows(padded.routes_BSLK),
        layer_numbers=padded.batch.meta.layer_numbers,
        replay_mask_T=padded.valid_BS.transpose(0, 1).reshape(-1),
    )
