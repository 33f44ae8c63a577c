"""The verl drop-in (``rr_megatron_compat.verl``) on real Megatron-Bridge models, driven with the
calls verl's Megatron engine makes: the patch before the model is built, R2 record through
``merge_router_topk_indices`` then replay through ``set_router_replay_data`` with moved router
weights, R3 through ``align_r3_router_replay_data`` / ``build_r3_replay_mask`` from a noisy
rollout's decoded routes. Each live router uses exactly the staged ids, the orphans Qwen3-VL's
double build leaves in Megatron's list (where verl's positional replay lands) and the MTP
router are never replayed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from bridge_models import (
    MODELS,
    Built,
    all_routers,
    loss,
    perturb,
    rollout_routes,
    token_batch,
    watch,
)

import rr_megatron_compat.verl as rv
from compat_megatron_steps import record_through_verl
from rr_core import controller_of

Action = rv.RouterReplayAction


@pytest.fixture
def dropin(bridge: None) -> Iterator[None]:
    rv.apply_router_replay_patch()  # verl's engine patches before bridge builds the model
    try:
        yield
    finally:
        rv.RouterReplay.clear_global_router_replay_action()
        rv.remove_router_replay_patch()


@pytest.fixture(params=MODELS, ids=lambda m: m.name)
def built(dropin: None, request: pytest.FixtureRequest) -> Built:
    """Each bridge model, built after verl's patch (as verl's engine builds it)."""
    return Built(request.param)


def check_orphans_left_out(built: Built) -> None:
    """rr's view holds the model's own routers; Megatron's list also holds the orphans'
    RouterReplay objects (their routers were collected with the replaced decoder)."""
    tc = built.chunk.config
    assert len(rv.RouterReplay.router_instances) == len(built.live) + len(built.mtp)
    assert len(built.registered) == len(built.live) * (2 if built.orphans else 1) + len(built.mtp)
    assert [n for n, _ in rv.iter_model_routers(built.chunk)] == list(built.layers)
    assert [v.layer_number for v in rv.RouterReplayHelper.get_micro_batch_router_list(tc)] == list(
        built.layers
    )
    assert all(controller_of(r) is not None for r in built.live)
    assert all(controller_of(r) is None for r in built.mtp)


def test_R2_through_the_verl_names_replays_every_live_router(built: Built) -> None:
    chunk, tc = built.chunk, built.chunk.config
    watched = all_routers(chunk)
    batches = [token_batch([5, 7], seed=0), token_batch([6, 6], seed=1)]
    mask = torch.ones(1, 12, dtype=torch.bool)
    with watch(watched) as native:
        routes = record_through_verl(chunk, batches, mask, loss)  # pp=1: gather unchanged
    assert routes.shape == (2, 12, len(built.layers), 2)
    check_orphans_left_out(built)
    for slot, router in enumerate(built.live):  # the record is what the routers chose
        wanted = routes[:, :, slot].flatten(0, 1).long().sort(-1).values
        assert torch.equal(native.rows(router), wanted), f"layer {router.layer_number}"

    perturb(watched)
    rv.RouterReplay.set_global_router_replay_action(Action.REPLAY_FORWARD)
    losses = []
    with watch(watched) as replayed:
        for mb, batch in enumerate(batches):
            rv.set_model_router_replay_action(chunk, Action.REPLAY_FORWARD)
            rv.set_router_replay_data(routes[mb : mb + 1], mask, tc, model=chunk)
            losses.append(loss(chunk, batch))
            rv.set_model_router_replay_action(chunk, Action.REPLAY_BACKWARD)
        for value in reversed(losses):  # backward out of forward order
            value.backward()
    rv.RouterReplay.clear_global_indices()
    for slot, router in enumerate(built.live):
        wanted = routes[:, :, slot].flatten(0, 1).long().sort(-1).values
        assert torch.equal(replayed.rows(router), wanted), f"layer {router.layer_number}"
    assert any(not torch.equal(replayed.rows(r), replayed.native_rows(r)) for r in built.live)
    built.check_untouched_and_native(replayed)


def test_R3_through_the_verl_names_replays_the_rollout_on_masked_rows(built: Built) -> None:
    chunk, tc = built.chunk, built.chunk.config
    rollouts = [rollout_routes(built, prompt) for prompt in ([5, 9, 2], [7, 1, 3, 4])]
    sequences = [torch.tensor(r.token_ids) for r, _ in rollouts]
    input_ids = torch.nested.nested_tensor(sequences, layout=torch.jagged)
    engine = torch.nested.nested_tensor([routes for _, routes in rollouts], layout=torch.jagged)
    aligned = rv.align_r3_router_replay_data(engine, input_ids)  # T-1 rows padded to T
    generated = [len(r.generated_ids) for r, _ in rollouts]
    response = torch.tensor([[1] * generated[0], [1] * (generated[1] - 1) + [0]])
    replay_mask = rv.build_r3_replay_mask(input_ids, response)
    rv.set_model_router_replay_action(chunk, Action.REPLAY_FORWARD)
    rv.set_router_replay_data(aligned, None, tc, replay_mask=replay_mask, model=chunk)
    batch = {
        "input_ids": torch.cat(sequences).unsqueeze(0),
        "position_ids": torch.cat([torch.arange(len(s)) for s in sequences]).unsqueeze(0),
    }
    batch["labels"] = batch["input_ids"].roll(-1, 1)
    with watch(all_routers(chunk)) as calls:
        loss(chunk, batch).backward()
    rv.RouterReplay.clear_global_indices()
    rows = replay_mask.values()
    assert 0 < int(rows.sum()) < rows.numel()
    target = torch.cat([routes for _, routes in rollouts])  # [T-1 per sequence]
    ends = torch.tensor([len(s) for s in sequences]).cumsum(0)
    keep = torch.ones(int(ends[-1]), dtype=torch.bool)
    keep[ends - 1] = False  # the last sampled token has no engine route
    assert not rows[~keep].any()
    for slot, router in enumerate(built.live):
        used = calls.rows(router)
        wanted = target[:, slot].long().sort(-1).values
        assert torch.equal(used[rows], wanted[rows[keep]]), f"layer {router.layer_number}"
        # rows outside the mask route natively (verl replays expert 0 there)
        assert torch.equal(used[~rows], calls.native_rows(router)[~rows])
    built.check_untouched_and_native(calls)
