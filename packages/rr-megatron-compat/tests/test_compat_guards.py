"""C1 - C3 with real megatron-core, and the replay flag on config instances (C4, the expert-bias
counts: test_compat_expert_bias.py)."""

from __future__ import annotations

import importlib.metadata

import pytest
from packaging.version import Version

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, capture_maps, inputs, random_targets, step
from rr_core import ReplayController, ReplayError, ReplayMode
from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, transformer_config


def _line_has_fusion() -> bool:
    """``TransformerConfig.moe_router_fusion`` exists from 0.14 (read from metadata: collecting
    this module must not import megatron)."""
    try:
        return Version(importlib.metadata.version("megatron-core")) >= Version("0.14")
    except importlib.metadata.PackageNotFoundError:
        return False


def test_replay_flag_is_set_on_the_instance_never_the_class(megatron: None) -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = transformer_config(TinyGPTConfig())
    other = transformer_config(TinyGPTConfig())
    assert rmc.enable_replay(config) is config
    assert rmc.replay_enabled(config)
    if rmc.megatron_line().native_replay:
        assert not rmc.replay_enabled(other)
        assert TransformerConfig.moe_enable_routing_replay is False


def test_replay_config_fields_build_a_config_that_replays(megatron: None) -> None:
    fields = rmc.replay_config_fields()
    assert fields == (
        {"moe_enable_routing_replay": True} if rmc.megatron_line().native_replay else {}
    )
    assert rmc.replay_enabled(transformer_config(TinyGPTConfig(extra=fields)))


def test_replay_flag_works_for_mla_transformer_config(megatron: None) -> None:
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        num_moe_experts=E,
        moe_router_topk=K,
        use_cpu_initialization=True,
        add_bias_linear=False,
    )
    rmc.enable_replay(config)
    assert rmc.replay_enabled(config)
    if rmc.megatron_line().native_replay:
        assert MLATransformerConfig.moe_enable_routing_replay is False


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_C1_duplicate_ids_are_refused_when_armed_and_dispatchers_survive_them(
    megatron: None, dispatcher: str
) -> None:
    model = build(dispatcher=dispatcher)
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model)
    try:
        dup = random_targets(16, 4)
        dup[3, 2, 1] = dup[3, 2, 0]
        controller.set_mode(ReplayMode.REPLAY)
        with pytest.raises(ReplayError, match=r"layer 3, row 3.*repeated expert id"):
            controller.arm(0, dup, layer_numbers=controller.layer_numbers)
        # routes that bypass the check: the dispatcher still runs, the row collapses
        controller.arm(0, dup, layer_numbers=controller.layer_numbers, validate=False)
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
        assert int(maps[3][0][3].sum()) == 1
        assert int(rmc.count_routed_tokens(maps[3][0])) == 16 * K - 1
    finally:
        controller.detach()


if _line_has_fusion():  # moe_router_fusion exists from 0.14: generated only there

    def test_C2_router_fusion_with_replay_is_an_error(megatron: None) -> None:
        config = transformer_config(TinyGPTConfig())
        config.moe_router_fusion = True
        with pytest.raises(rmc.ReplayConfigError, match="C2"):
            rmc.enable_replay(config)


def test_C2_a_hook_that_never_fires_raises(megatron: None) -> None:
    """Routing that bypasses the top-k hook (here sinkhorn; fusion does the same) raises
    instead of routing natively under a REPLAY mode."""
    model = build(extra={"moe_router_load_balancing_type": "sinkhorn"})
    controller = ReplayController(num_experts=E, top_k=K)
    with pytest.raises(rmc.ReplayConfigError, match="sinkhorn"):
        rmc.attach(controller, model)
    controller.attach(model)  # bypassing the checks
    try:
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, random_targets(16, 4), layer_numbers=controller.layer_numbers)
        with pytest.raises(ReplayError, match="hook never fired"):
            step(model, inputs(1), controller)
    finally:
        controller.detach()


def test_C2_native_line_model_built_without_the_flag_is_refused(megatron: None) -> None:
    model = build_gpt(TinyGPTConfig())
    controller = ReplayController(num_experts=E, top_k=K)
    if rmc.megatron_line().native_replay:
        with pytest.raises(rmc.ReplayConfigError, match="enable_replay"):
            rmc.attach(controller, model)
    else:
        rmc.attach(controller, model)
    controller.detach()


@pytest.mark.parametrize("policy", ["warn", "raise", "allow"])
def test_C3_capacity_factor_warns_or_refuses(megatron: None, policy: str) -> None:
    config = transformer_config(TinyGPTConfig(extra={"moe_expert_capacity_factor": 1.0}))
    if policy == "warn":
        with pytest.warns(rmc.ReplayNotEquivalentWarning, match="C3"):
            rmc.check_replay_config(config, capacity=policy)
    elif policy == "raise":
        with pytest.raises(rmc.ReplayConfigError, match="C3"):
            rmc.check_replay_config(config, capacity=policy)
    else:
        rmc.check_replay_config(config, capacity=policy)
