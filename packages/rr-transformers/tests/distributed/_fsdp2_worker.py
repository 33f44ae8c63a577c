"""One rank of an FSDP2 R3 training step on a tiny transformers MoE model (runs inside a
spawned gloo rank; returns plain data for the parent to check).

The rank generates its own shard of rollouts with an engine copy of the model whose router
numerics differ (rr_fakes.RolloutEmulator's noise), decodes the engine's routes through rr_vllm
(all-layers axis, T-1 rows per sequence), shards the trainer with ``fully_shard`` on every
decoder layer and the root, checkpoints every layer with transformers' non-reentrant
checkpointing, replays the routes and takes one optimizer step.

Shapes: B sequences, S padded length, N = B*S router rows, K top-k.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

PROMPT_LENGTHS = (5, 7)  # one shard: two sequences of different lengths, right padded
NEW_TOKENS = 4
NOISE = 0.05  # on the softmax / sigmoid scores at the engine's top-k step
ERA = "0.22-0.31"


def _prompts(rank: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return [torch.randint(3, 90, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _rows(ids_NK: torch.Tensor) -> list[list[int]]:
    return [sorted(row) for row in ids_NK.tolist()]


def rollout_batch(model_type: str, rank: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """This rank's rollouts as the engine returned them, decoded into a RouteBatch, with the
    padded token batch the trainer sees."""
    import rr_transformers
    from rr_core import RouteMeta
    from rr_fakes import RolloutEmulator
    from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, right_padded, tiny_model
    from rr_vllm import DecodeOptions, decode_vllm_output

    engine = tiny_model(model_type)  # the inference engine's own copy of the weights
    num_layers = len(rr_transformers.decoder_layers(engine))
    emulator = RolloutEmulator(
        engine,
        NUM_EXPERTS,
        TOP_K,
        num_layers=num_layers,
        noise=NOISE,
        seed=rank,
        attach=lambda c, m: rr_transformers.attach(c, m).layer_numbers,
        forward=lambda m, ids: m(input_ids=ids).logits,
    )
    rollouts = [emulator.generate(p, max_new_tokens=NEW_TOKENS) for p in _prompts(rank)]
    meta = RouteMeta(
        num_experts=NUM_EXPERTS,
        top_k=TOP_K,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, num_layers + 1)),
        moe_layer_numbers=rollouts[0].moe_layer_numbers,
    )
    outputs = [r.vllm_output(ERA) for r in rollouts]
    batch = decode_vllm_output(outputs, DecodeOptions(meta=meta)).to_batch()
    ids_BS, mask_BS = right_padded([r.token_ids for r in rollouts])
    return batch, ids_BS, mask_BS


def _loss(logits_BSV: torch.Tensor, ids_BS: torch.Tensor, mask_BS: torch.Tensor) -> torch.Tensor:
    keep = (mask_BS[:, 1:] * mask_BS[:, :-1]).flatten().bool()
    per_token = nn.functional.cross_entropy(
        logits_BSV[:, :-1].flatten(0, 1).float(), ids_BS[:, 1:].flatten(), reduction="none"
    )
    return per_token[keep].mean()


def fsdp2_r3_step(model_type: str) -> dict[str, Any]:
    """One R3 training step of ``model_type`` on this rank; what happened, as plain data."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import rr_transformers
    from _helpers import expert_inputs
    from rr_core import ReplayController, ReplayMode
    from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, routers_of, tiny_model

    rank = dist.get_rank()
    rr_transformers.install()
    try:
        batch, ids_BS, mask_BS = rollout_batch(model_type, rank)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        model = tiny_model(model_type).train()
        with warnings.catch_warnings():  # 5.24 renamed it; trainers still call this name
            warnings.filterwarnings("ignore", "`gradient_checkpointing_enable`", FutureWarning)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        for layer in rr_transformers.decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
        attachment = rr_transformers.attach(controller, model)
        try:
            controller.set_mode(ReplayMode.REPLAY)
            rr_transformers.arm_routes(controller, 0, batch, attention_mask=mask_BS)
            armed_NLK, replay_N = rr_transformers.routes_for_padded(batch, mask_BS)
            with expert_inputs(model) as seen:
                with controller.microbatch(0) as scope:
                    logits = model(input_ids=ids_BS, attention_mask=mask_BS, use_cache=False).logits
                    scope.track(logits)
                forwards = {layer: len(calls) for layer, calls in seen.items()}
                loss = _loss(logits, ids_BS, mask_BS)
                loss.backward()
            report = controller.end_step()
        finally:
            controller.detach()
        routers = dict(zip(attachment.layer_numbers, routers_of(model), strict=True))
        grads = {n: float(r.weight.grad.full_tensor().abs().sum()) for n, r in routers.items()}
        before = {n: r.weight.to_local().clone() for n, r in routers.items()}
        optimizer.step()
        moved = {n: not torch.equal(r.weight.to_local(), before[n]) for n, r in routers.items()}
    finally:
        rr_transformers.uninstall()
    return {
        "rank": rank,
        "tokens": ids_BS.tolist(),
        "layers": attachment.layer_numbers,
        "layer_class": type(rr_transformers.decoder_layers(model)[0]).__name__,
        "replayed_rows": int(replay_N.sum()),
        "rollout_rows": int(mask_BS.sum()) - len(ids_BS),  # T-1 routed rows per sequence
        "armed": {n: _rows(armed_NLK[replay_N, n - 1]) for n in attachment.layer_numbers},
        "forward": {
            n: [_rows(ids[replay_N]) for ids, _ in c[: forwards[n]]] for n, c in seen.items()
        },
        "recompute": {
            n: [_rows(ids[replay_N]) for ids, _ in c[forwards[n] :]] for n, c in seen.items()
        },
        "agreement": report.agreement,
        "loss": loss.item(),
        "router_grad": grads,
        "router_moved": moved,
    }


def fsdp2_r3_steps(model_types: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """:func:`fsdp2_r3_step` for each family in turn, in one pair of processes."""
    return {model_type: fsdp2_r3_step(model_type) for model_type in model_types}
