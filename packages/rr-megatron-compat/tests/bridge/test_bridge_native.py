"""rr's own API on real Megatron-Bridge models: Qwen3-VL MoE (its language model built twice:
orphan routers registered ahead of the live ones) and Qwen3.5 MoE with an MTP layer (its router
numbered 1). R2 records in an old-policy forward and replays in a training forward with moved
router weights; R3 replays a noisy rollout's routes as rr_vllm decodes vLLM's output. Each live
router uses exactly the recorded / rollout ids, orphans are never touched, the MTP router
routes natively."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from bridge_models import (
    MODELS,
    QWEN3_VL_MOE,
    QWEN35_MOE_MTP,
    VOCAB,
    BridgeModel,
    Built,
    E,
    K,
    all_routers,
    assert_replayed,
    fed,
    perturb,
    registered,
    rollout_routes,
    watch,
)

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.megatron import RECOMPUTE, gpt_inputs, route_log, train_step


@pytest.fixture
def native(bridge: None) -> Iterator[None]:
    rmc.install()
    try:
        yield
    finally:
        rmc.uninstall()


def test_bridge_builds_with_transformer_engine_absent_everywhere_else(native: None) -> None:
    """The import placeholder answers bridge's one unconditional TE import only: megatron-core's
    and bridge's own TE probes still find no TE, and the model is built from local modules."""
    import sys

    from megatron.bridge.peft import lora_layers, utils
    from megatron.core.models.gpt import gpt_layer_specs

    assert "transformer_engine" not in sys.modules
    assert not gpt_layer_specs.HAVE_TE
    assert not utils.HAVE_TE_PYTORCH_GROUPED_LINEAR
    with pytest.raises(RuntimeError, match="Transformer Engine is not installed"):
        lora_layers.te.Linear(4, 4)
    built = Built(QWEN35_MOE_MTP)
    names = {type(m).__module__ for m in built.chunk.modules()}
    assert not any("transformer_engine" in n for n in names)


def test_qwen3_vl_moe_registers_orphan_routers_ahead_of_the_live_ones(native: None) -> None:
    built = Built(QWEN3_VL_MOE)
    live = [r.router_replay for r in built.live]
    assert built.layers == (1, 2, 3)
    assert len(built.registered) == 2 * len(live)  # every layer's router twice
    assert [id(i) for i in built.registered[len(live) :]] == [id(i) for i in live]
    assert len(built.orphans) == len(live)  # and the first ones are orphans
    assert [id(i) for i in built.registered[: len(live)]] == [id(i) for i in built.orphans]


def test_qwen3_vl_moe_megatrons_positional_replay_puts_live_routes_on_the_orphans(
    native: None,
) -> None:
    """What rr avoids: Megatron's own ``RouterReplay.set_replay_data`` addresses routers by
    position in the global list. One tensor per live layer is refused; in a list sized to the
    registry, positions 0..2 (where a caller slicing by layer offset puts layers 1..3) reach
    the orphans, and the live routers get what comes after."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    built = Built(QWEN3_VL_MOE)
    assert len(registered()) == len(built.registered)  # the list holds this model's only
    by_position = [torch.full((4, K), i, dtype=torch.long) for i in range(len(built.registered))]
    with pytest.raises(ValueError, match=r"does not match instances \(6\)"):
        RouterReplay.set_replay_data(by_position[: len(built.live)])
    RouterReplay.set_replay_data(by_position)
    try:
        assert [int(o.target_topk_idx[0, 0]) for o in built.orphans] == [0, 1, 2]
        assert [int(r.router_replay.target_topk_idx[0, 0]) for r in built.live] == [3, 4, 5]
    finally:
        RouterReplay.clear_global_indices()


def test_qwen35_moe_mtp_router_is_numbered_1_and_registered_after_the_decoder(
    native: None,
) -> None:
    built = Built(QWEN35_MOE_MTP)
    assert built.layers == (1, 2)
    assert [r.layer_number for r in built.mtp] == [1]
    assert built.orphans == []
    order = [r.router_replay for r in [*built.live, *built.mtp]]
    assert [id(i) for i in built.registered] == [id(i) for i in order]


def controller_for(built: Built) -> ReplayController:
    controller = ReplayController(num_experts=E, top_k=K)
    attached = rmc.attach(controller, built.chunk).layer_numbers
    assert attached == built.layers  # MTP and orphans left out
    return controller


@pytest.mark.parametrize("spec", MODELS, ids=lambda m: m.name)
def test_R2_record_in_the_old_policy_forward_then_replay_with_moved_weights(
    native: None, spec: BridgeModel
) -> None:
    """Two micro-batches, Megatron's full activation recompute: the backward's recompute
    replays each micro-batch's own record too."""
    built = Built(spec, RECOMPUTE)
    controller = controller_for(built)
    batches = [gpt_inputs(2, 8, VOCAB, seed=i) for i in range(2)]
    watched = all_routers(built.chunk)
    try:
        controller.set_mode(ReplayMode.RECORD)
        with watch(watched) as recorded:
            train_step([built.chunk], batches, controller, forward_only=True)
        routes = torch.cat([controller.recorded(i) for i in range(2)])  # [2 x 16 tokens, L, K]
        controller.end_step()
        for slot, router in enumerate(built.live):  # the record is what the routers chose
            assert torch.equal(recorded.rows(router), routes[:, slot].long().sort(-1).values)
        built.check_untouched_and_native(recorded)

        perturb(watched)
        controller.set_mode(ReplayMode.REPLAY)
        for mb in range(2):
            controller.arm(mb, routes[16 * mb : 16 * (mb + 1)], layer_numbers=built.layers)
        with watch(watched) as replayed, route_log(built.chunk) as log:
            train_step([built.chunk], batches, controller)
        controller.end_step()
    finally:
        controller.detach()
    assert_replayed(built, replayed, routes)
    for slot, layer in enumerate(built.layers):
        wanted = routes[:, slot].long().sort(-1).values
        assert torch.equal(log.rows(layer, recompute=True), wanted), f"layer {layer} recompute"
    built.check_untouched_and_native(replayed)
    assert all(r.weight.grad is not None for r in built.live)


@pytest.mark.parametrize("spec", MODELS, ids=lambda m: m.name)
def test_R3_replays_the_rollout_routes_rr_vllm_decodes(native: None, spec: BridgeModel) -> None:
    built = Built(spec)
    rollout, routes = rollout_routes(built, [5, 9, 2, 7, 1, 3])
    controller = controller_for(built)
    try:
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, routes, layer_numbers=built.layers)
        with watch(all_routers(built.chunk)) as calls:
            train_step([built.chunk], [fed(rollout)], controller)
        report = controller.end_step()
    finally:
        controller.detach()
    assert_replayed(built, calls, routes)
    assert min(report.agreement.values()) < 1.0  # the engine's noise changed some routes
    built.check_untouched_and_native(calls)
