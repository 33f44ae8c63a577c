"""The rollout emulator: T-1 rows on the all-layers axis, dense layers zero, noise that flips
near-tied routes, prefix caching, and every engine era's output from one rollout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rr_core
from rr_core.replay.controller import attached_router_count
from rr_fakes._rollout import RolloutEmulator, record_routes
from rr_fakes._tiny_moe import build_tiny_moe
from rr_fakes.emulations.engines import VllmEra

E, K, LAYERS = 8, 2, 4
FREQ = [0, 1, 1, 1]  # layer 1 dense (A2)
PROMPT = [3, 14, 15, 9, 26, 5]


@pytest.fixture
def model() -> torch.nn.Module:
    return build_tiny_moe(num_layers=LAYERS, moe_layer_freq=FREQ, num_experts=E, top_k=K)


def test_tiny_model_routers_are_found_by_layer(model: torch.nn.Module) -> None:
    assert [layer for layer, _ in rr_core.walk_routers(model)] == [2, 3, 4]
    assert model(torch.tensor([PROMPT])).shape == (1, len(PROMPT), 64)


def test_greedy_rollout_matches_trainer_without_noise(model: torch.nn.Module) -> None:
    rollout = RolloutEmulator(model, E, K).generate(PROMPT, max_new_tokens=5)
    p, g = len(PROMPT), len(rollout.generated_ids)
    assert g == 5
    assert rollout.routes_TLK.shape == (p + g - 1, LAYERS, K)  # the last token has no row
    assert not rollout.routes_TLK[:, 0].any()  # dense layer: all-zero rows
    assert rollout.moe_layer_numbers == (2, 3, 4)
    trainer = record_routes(model, rollout.token_ids, num_experts=E, top_k=K)
    assert trainer.shape == (p + g, LAYERS, K)
    assert np.array_equal(rollout.routes_TLK, trainer[:-1])
    assert attached_router_count() == 0


def test_noise_perturbs_some_routes_but_keeps_them_valid(model: torch.nn.Module) -> None:
    rollout = RolloutEmulator(model, E, K, noise=0.05, seed=1).generate(PROMPT, max_new_tokens=12)
    trainer = record_routes(model, rollout.token_ids, num_experts=E, top_k=K)[:-1]
    moe = rollout.routes_TLK[:, 1:]
    same = np.sort(moe, -1) == np.sort(trainer[:, 1:], -1)
    assert 0.0 < same.all(-1).mean() < 1.0
    assert ((moe >= 0) & (moe < E)).all()
    assert (np.sort(moe, -1)[..., 1:] != np.sort(moe, -1)[..., :-1]).all()  # K distinct


def test_sampling_is_seeded_and_eos_stops(model: torch.nn.Module) -> None:
    def sample(seed: int) -> tuple[int, ...]:
        emulator = RolloutEmulator(model, E, K, seed=seed)
        return emulator.generate(PROMPT, max_new_tokens=8, temperature=1.0).generated_ids

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1
    greedy = RolloutEmulator(model, E, K).generate(PROMPT, max_new_tokens=8).generated_ids
    stopped = RolloutEmulator(model, E, K).generate(PROMPT, max_new_tokens=8, eos_id=greedy[2])
    assert stopped.generated_ids == greedy[: greedy.index(greedy[2]) + 1]
    assert stopped.routes_TLK.shape[0] == len(PROMPT) + len(stopped.generated_ids) - 1


def test_rollout_in_every_engine_era(model: torch.nn.Module) -> None:
    rollout = RolloutEmulator(model, E, K).generate(PROMPT, max_new_tokens=4)
    rows = len(PROMPT) + 3
    v14 = rollout.vllm_output(VllmEra.V0_14).outputs[0].routed_experts
    assert v14.dtype == np.int32
    assert v14.shape == (rows, LAYERS, K)
    v21 = rollout.vllm_output(VllmEra.V0_21)
    assert v21.prompt_routed_experts.shape == (len(PROMPT), 3, K)
    assert v21.outputs[0].routed_experts.shape == (3, 3, K)
    v32 = rollout.vllm_output(VllmEra.V0_32, prompt_start=2).outputs[0].routed_experts
    assert v32.dtype == np.uint8
    assert np.array_equal(v32, rollout.routes_TLK[2:])
    assert "routed_experts" in rollout.sglang_output()["meta_info"]


def test_prefix_cache_reuses_rows_of_the_earlier_request(model: torch.nn.Module) -> None:
    emulator = RolloutEmulator(model, E, K, noise=0.05, prefix_caching=True, block_size=4)
    first = emulator.generate(PROMPT, max_new_tokens=3)
    second = emulator.generate([*PROMPT[:5], 40, 41], max_new_tokens=3)
    assert first.cached_prefix == 0
    assert second.cached_prefix == 4  # whole blocks only
    assert np.array_equal(second.routes_TLK[:4], first.routes_TLK[:4])
    prompt_rows = second.vllm_output(VllmEra.V0_21).prompt_routed_experts
    assert (prompt_rows[:4] == -1).all()
    assert (prompt_rows[4:] >= 0).all()


def test_trainer_replays_rollout_routes(model: torch.nn.Module) -> None:
    rollout = RolloutEmulator(model, E, K, noise=0.05, seed=3).generate(PROMPT, max_new_tokens=10)
    tokens = torch.tensor([rollout.token_ids])
    t = tokens.shape[1]
    routes = torch.zeros(t, LAYERS, K, dtype=torch.long)
    routes[:-1] = torch.from_numpy(rollout.routes_TLK)
    mask = torch.ones(t, dtype=torch.bool)
    mask[-1] = False  # the final row has no route: native routing there
    controller = rr_core.ReplayController(num_experts=E, top_k=K)
    controller.attach(model)
    try:
        controller.set_mode(rr_core.ReplayMode.REPLAY)
        controller.arm(0, routes, layer_numbers=range(1, LAYERS + 1), replay_mask_T=mask)
        with torch.no_grad():
            model(tokens)
        agreement = controller.end_step().agreement
    finally:
        controller.detach()
    assert set(agreement) == {2, 3, 4}
    assert min(agreement.values()) < 1.0
