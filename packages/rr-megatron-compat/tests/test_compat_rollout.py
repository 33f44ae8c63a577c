"""R3 end to end: rr_fakes' RolloutEmulator generates with a real GPTModel through rr's hooks
(noisy router numerics, as an inference engine), then the trainer replays the captured routes
and reproduces them exactly in every layer."""

from __future__ import annotations

import torch
from torch import nn

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, capture_maps, map_of
from rr_core import ReplayController, ReplayMode
from rr_fakes import RolloutEmulator
from rr_fakes.shims.megatron import model_parallel


def _logits(model: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids_1S.shape[1]).unsqueeze(0)
    out: torch.Tensor = model(ids_1S, positions, attention_mask=None)
    return out


def test_rollout_with_noise_then_r3_replay_reproduces_the_rollout_routes() -> None:
    with model_parallel():
        rmc.install()
        try:
            model = build(moe_layer_freq=[0, 1, 1, 1])
            model.eval()
            emulator = RolloutEmulator(model, E, K, noise=0.5, seed=3, forward=_logits)
            rollout = emulator.generate([5, 9, 2, 7, 1, 3], max_new_tokens=5)
            routes_TLK = torch.from_numpy(rollout.routes_TLK)  # [T-1, 4, K], all layers
            fed = torch.tensor([rollout.token_ids[:-1]])
            controller = ReplayController(num_experts=E, top_k=K)
            rmc.attach(controller, model)
            try:
                controller.set_mode(ReplayMode.REPLAY)
                controller.arm(0, routes_TLK, layer_numbers=(1, 2, 3, 4))
                with torch.no_grad(), capture_maps(model) as maps, controller.microbatch(0):
                    _logits(model, fed)
                report = controller.end_step()
            finally:
                controller.detach()
            for layer in (2, 3, 4):
                assert torch.equal(maps[layer][0], map_of(routes_TLK[:, layer - 1]))
            assert min(report.agreement.values()) < 1.0  # the noise changed some routes
        finally:
            rmc.uninstall()
