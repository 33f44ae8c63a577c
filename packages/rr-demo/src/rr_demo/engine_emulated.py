"""The emulated rollout engine: rr_fakes' ``RolloutEmulator`` serving the trainer's own model
with noisy router numerics, standing in for vLLM ``EMULATED_VLLM``.

Around the emulator the demo does what it does for a real engine: capture is configured with
the engine arguments and per-request sampling fields ``rr_vllm`` gives for that release
(``vllm_engine_args``: prefix caching, which 0.32+ captures through; ``vllm_sampling_fields``:
``max_tokens`` and ``routed_experts_prompt_start``), and the engine returns that release's
``RequestOutput`` objects (vLLM's own classes where vllm imports), which the chain decodes.

Shapes: G sampled tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rr_core import RouteMeta
from rr_demo.chain import EngineOutput, OpenTrainer, Trainer
from rr_demo.config import Progress, Sampling

#: The vLLM release the emulated engine's outputs and capture settings are those of.
EMULATED_VLLM = "0.33.0"


@contextmanager
def roll_out(
    cfg: Sampling, progress: Progress, open_trainer: OpenTrainer
) -> Iterator[tuple[Trainer, EngineOutput]]:
    """The trainer on the config's own model, and the emulated engine's rollout on it."""
    with open_trainer(None) as trainer:
        progress("roll out with an emulated engine (noisy router numerics)")
        yield trainer, emulated_rollout(trainer, cfg)


def emulated_rollout(trainer: Trainer, cfg: Sampling) -> EngineOutput:
    """``cfg.batch`` sampled continuations of random prompts, returned as vLLM
    ``EMULATED_VLLM`` returns them, with the engine's log-prob of each sampled token."""
    from rr_fakes import RolloutEmulator
    from rr_fakes.emulations.engines import era_of
    from rr_vllm import ModelGeometry, vllm_engine_args, vllm_sampling_fields

    geometry = ModelGeometry(
        num_hidden_layers=trainer.num_layers, num_experts=trainer.num_experts, top_k=trainer.top_k
    )
    engine_args = vllm_engine_args(geometry, vllm_version=EMULATED_VLLM)
    steps: list[torch.Tensor] = []  # the log-softmax of each forward's last position

    def engine_forward(model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
        logits = trainer.forward(model, ids_1S)
        steps.append(torch.log_softmax(logits[0, -1].float(), dim=-1))
        return logits

    emulator = RolloutEmulator(
        trainer.model,
        trainer.num_experts,
        trainer.top_k,
        num_layers=trainer.num_layers,
        noise=cfg.noise,
        seed=cfg.seed,
        forward=engine_forward,
        attach=trainer.attach_recorder,
        prefix_caching=bool(engine_args.get("enable_prefix_caching", False)),
    )
    g = torch.Generator().manual_seed(cfg.seed)
    outputs, logprobs, starts = [], [], []
    for b in range(cfg.batch):
        prompt = torch.randint(0, trainer.vocab_size, (cfg.prompt_length,), generator=g).tolist()
        fields = vllm_sampling_fields(
            len(prompt),
            prompt_length=cfg.prompt_length,
            response_length=cfg.new_tokens,
            max_model_len=cfg.prompt_length + cfg.new_tokens,  # room for the whole rollout
            vllm_version=EMULATED_VLLM,
        )
        start = fields.get("routed_experts_prompt_start", 0)
        steps.clear()
        rollout = emulator.generate(prompt, max_new_tokens=fields["max_tokens"], temperature=1.0)
        new = torch.tensor(rollout.generated_ids)
        logprobs.append(torch.stack(steps)[torch.arange(len(new)), new])
        outputs.append(
            rollout.vllm_output(era_of(EMULATED_VLLM), prompt_start=start, request_id=str(b))
        )
        starts.append(start)
    meta = RouteMeta(
        num_experts=trainer.num_experts,
        top_k=trainer.top_k,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, trainer.num_layers + 1)),
        moe_layer_numbers=rollout.moe_layer_numbers,
    )
    return EngineOutput(outputs, logprobs, meta, starts)
