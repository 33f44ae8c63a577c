"""The transformers trainer: a tiny transformers MoE model of a family rr knows (random
initialised by ``rr_fakes.shims.hf_models``, no download, or the real engine's checkpoint loaded
with ``from_pretrained``), replayed as a transformers user replays: ``rr_transformers.install``
and ``attach``, the decoded batch armed with ``rr_transformers.arm_routes`` (the padded batch
row by row), the training step's forward inside ``controller.microbatch(0)`` with its loss
tracked for the checkpointed recompute. Expert use is read from what each layer's experts
module received. Nothing here imports megatron.

Shapes: B sequences, S padded length, N = B * S rows, K top-k, E experts, V vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayMode
from rr_demo.chain import Padded
from rr_demo.config import DemoError, Progress, TransformersDemoConfig


class UnknownDemoFamilyError(DemoError, ValueError):
    """A ``--family`` the demo has no tiny config for."""


def demo_families() -> tuple[str, ...]:
    """The families the demo can build (those of ``rr_fakes.shims.hf_models`` that rr_transformers
    knows and the installed transformers has)."""
    import rr_transformers
    from rr_fakes.shims.hf_models import FAMILY_CONFIGS

    version = rr_transformers.installed_transformers_version()
    if version is None:
        return ()
    known = rr_transformers.KNOWN_FAMILIES
    return tuple(n for n in FAMILY_CONFIGS if n in known and known[n].available(version))


@contextmanager
def open_trainer(
    cfg: TransformersDemoConfig, progress: Progress, checkpoint: Any = None
) -> Iterator[TransformersTrainer]:
    """Build the model with rr's router hooks installed (removed afterwards unless they were
    installed before): a random tiny model of the family, or ``checkpoint`` (an
    ``rr_fakes.shims.hf_checkpoints.HFCheckpoint``) loaded with ``from_pretrained`` in float32."""
    import rr_transformers
    from rr_fakes.shims.hf_models import tiny_model

    families = demo_families()
    if cfg.family not in families:
        raise UnknownDemoFamilyError(
            f"no demo model for family {cfg.family!r}; choose one of {', '.join(families)}"
        )
    already = rr_transformers.is_installed()
    rr_transformers.install()
    try:
        if checkpoint is not None:
            progress(f"load the {cfg.family} checkpoint into a real transformers model")
            model = checkpoint.load_model(torch.float32)
        else:
            progress(f"build a real transformers {cfg.family} model")
            model = tiny_model(cfg.family, seed=cfg.seed)
        family = rr_transformers.KNOWN_FAMILIES[cfg.family]
        config = model.config.get_text_config()
        num_experts, top_k = family.sizes(config)
        yield TransformersTrainer(
            model, num_experts, top_k, int(config.vocab_size), len(model.get_decoder().layers)
        )
    finally:
        if not already:
            rr_transformers.uninstall()


@dataclass
class TransformersTrainer:
    model: nn.Module
    num_experts: int
    top_k: int
    vocab_size: int
    num_layers: int

    def forward(self, model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = model(input_ids=ids_1S).logits
        return logits

    def attach_recorder(self, recorder: ReplayController, model: nn.Module) -> tuple[int, ...]:
        import rr_transformers

        return rr_transformers.attach(recorder, model).layer_numbers

    def versions(self) -> dict[str, str]:
        import rr_transformers

        model: Any = self.model
        model_type = model.config.get_text_config().model_type
        return {
            "transformers_version": str(rr_transformers.installed_transformers_version()),
            "model_type": str(model_type),
        }

    def _armed(self, padded: Padded, *, replay: bool) -> ReplayController:
        import rr_transformers

        controller = ReplayController(num_experts=self.num_experts, top_k=self.top_k)
        rr_transformers.attach(controller, self.model)
        if replay:
            controller.set_mode(ReplayMode.REPLAY)
            rr_transformers.arm_routes(controller, 0, padded.batch, attention_mask=padded.mask_BS)
        return controller

    def trainer_forward(
        self, padded: Padded, *, replay: bool
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        controller = self._armed(padded, replay=replay)
        try:
            with torch.no_grad(), _expert_ids(self.model) as seen:
                out = self.model(input_ids=padded.ids_BS, attention_mask=padded.mask_BS)
            controller.end_step()
        finally:
            controller.detach()
        B, S = padded.ids_BS.shape
        used = {
            layer: torch.zeros(B * S, self.num_experts, dtype=torch.bool)
            .scatter(1, ids_NK.long(), True)
            .reshape(B, S, -1)
            for layer, ids_NK in seen.items()
        }
        return used, out.logits

    def train_step(self, padded: Padded) -> float:
        """Forward + backward with transformers' gradient checkpointing (the recompute in
        backward replays the same routes)."""
        labels_BS = padded.ids_BS.masked_fill(padded.mask_BS == 0, -100)
        model: Any = self.model
        model.train()
        _checkpointing(model, on=True)
        controller = self._armed(padded, replay=True)
        try:
            with controller.microbatch(0) as scope:
                out = model(
                    input_ids=padded.ids_BS, attention_mask=padded.mask_BS, labels=labels_BS
                )
                scope.track(out.loss)
            out.loss.backward()
            controller.end_step()
        finally:
            controller.detach()
            _checkpointing(model, on=False)
            model.zero_grad(set_to_none=True)
            model.eval()
        return float(out.loss.detach())


def _checkpointing(model: Any, *, on: bool) -> None:
    """Activation checkpointing (non-reentrant) on or off; newer transformers renamed
    ``gradient_checkpointing_*`` to ``activation_checkpointing_*`` and deprecated the old name."""
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            kwargs = {"activation_checkpointing_kwargs": {"use_reentrant": False}}
            model.activation_checkpointing_enable(**kwargs)
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


@contextmanager
def _expert_ids(model: nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """Per decoder layer (1-based), the expert ids ``[N, K]`` its experts module received in
    the last forward (the families pass them positionally or by keyword)."""
    seen: dict[int, torch.Tensor] = {}
    with contextlib.ExitStack() as hooks:
        for index, layer in enumerate(model.get_decoder().layers):  # type: ignore[operator]
            for module in layer.modules():
                experts = getattr(module, "experts", None)
                if isinstance(experts, nn.Module):

                    def hook(_m: nn.Module, args: Any, kwargs: Any, layer: int = index + 1) -> None:
                        ids = args[1] if len(args) > 1 else None
                        ids = kwargs.get("top_k_index", kwargs.get("router_indices", ids))
                        seen[layer] = ids.detach()

                    hooks.enter_context(experts.register_forward_pre_hook(hook, with_kwargs=True))
        yield seen
