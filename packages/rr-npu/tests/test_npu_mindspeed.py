"""Replay under the emulated MindSpeed, on real megatron-core (0.12.3 and 0.16.1).

Real-world failures guarded against: MindSpeed's ``repatch()`` (an engine calls it at the end of
its constructor) re-installing ``wrapper(first_original)`` and silently dropping rr's hooks;
the per-instance TransformerConfig rebuild stripping a replay flag (class defaults) or every
field (hidden signatures, ZeroDivisionError); ``dataclasses.replace`` / pickling of rebuilt
configs losing the flag; ``--moe-tp-extend-ep`` / ``--fix-router`` bypassing replay hooks;
replay patches for newer Megatron crashing on 0.12 as soon as aux loss, token dropping or group
top-k is on (C6).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import rr_megatron_compat as rmc
import rr_npu
from rr_core import ReplayController, ReplayMode
from rr_fakes.megatron import unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _mod(name: str) -> Any:
    return importlib.import_module(f"megatron.core.{name}")


@contextmanager
def mindspeed(
    *, router_wrapper: bool = True, import_adaptor: bool = False, **kwargs: Any
) -> Iterator[Any]:
    """The emulation on the real classes. ``router_wrapper`` adds a MindSpeed stacking patch on
    ``TopKRouter.routing`` (an attribute rr hooks), so a repatch really drops rr's proxy."""
    from rr_fakes.mindspeed_emu import dotted_name, emulated_mindspeed

    tc, router = _mod("transformer.transformer_config"), _mod("transformer.moe.router")
    with emulated_mindspeed(
        config_classes=(tc.TransformerConfig, tc.MLATransformerConfig),
        router_class=router.TopKRouter,
        moe_utils=_mod("transformer.moe.moe_utils"),
        **kwargs,
    ) as ms:
        if router_wrapper:
            register = ms.register

            def routing_wrapper(fn: Any) -> Any:
                @functools.wraps(fn)
                def routing(*a: Any, **kw: Any) -> Any:
                    return fn(*a, **kw)

                return routing

            def register_with_router_patch() -> None:
                register()
                ms.manager.register_patch(
                    dotted_name(router.TopKRouter, "routing"), routing_wrapper
                )

            ms.register = register_with_router_patch
        if import_adaptor:
            ms.import_adaptor()
        yield ms


def _extra(**more: Any) -> dict[str, Any]:
    flag = rmc.replay_config_fields()
    return {**flag, **more}


def _assert_config_intact(config: Any) -> None:
    assert type(config).__module__ == "types"  # rebuilt per instance by MindSpeed
    assert "num_layers" in inspect.signature(type(config)).parameters
    assert config.kv_channels == config.hidden_size // config.num_attention_heads
    assert rmc.replay_enabled(config)


def _round_trip(extra: dict[str, Any] | None = None, capacity: str = "warn") -> dict[int, float]:
    from rr_fakes.megatron import TinyGPTConfig, build_gpt, gpt_inputs, train_step

    model = build_gpt(TinyGPTConfig(extra=_extra(**(extra or {}))))
    _assert_config_intact(model.config)
    batch = gpt_inputs(2, 8, 64)
    controller = ReplayController(num_experts=8, top_k=2)
    try:
        rr_npu.attach(controller, model, capacity=capacity)
        controller.set_mode(ReplayMode.RECORD)
        train_step([model], [batch])
        routes = controller.recorded(0)
        controller.end_step()
        assert routes is not None
        assert tuple(routes.shape) == (16, 4, 2)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, routes, layer_numbers=controller.layer_numbers)
        train_step([model], [batch])
        agreement = controller.end_step().agreement
    finally:
        rr_npu.detach(controller)
    assert agreement == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    return agreement


def _rr_proxy(owner: Any, name: str) -> Any:
    from rr_megatron_compat._install import _chain, _current

    found = [p for p in _chain(_current(owner, name)) if isinstance(p, rmc.RRProxy)]
    active = [p for p in found if p._self_rr_active]
    assert len(active) == 1, found
    return active[0]


def test_order_mindspeed_adaptor_first() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True):
        rr_npu.install()
        try:
            assert rmc.is_installed()
            _round_trip()
        finally:
            rr_npu.uninstall()


def test_order_rr_first_then_repatch_reinstalls_dropped_hooks() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True) as ms:
        router = _mod("transformer.moe.router").TopKRouter
        rr_npu.install()
        try:
            before = _rr_proxy(router, "routing")
            ms.repatch({"some_engine_flag": 1})  # wrapper(first_original): rr's proxy dropped
            after = _rr_proxy(router, "routing")  # put back by identity right after the repatch
            assert after is not before
            assert rmc.is_installed()
            assert rr_npu.ensure_installed() == ()
            _round_trip()
        finally:
            rr_npu.uninstall()
        assert not isinstance(ms.manager.apply_patches, rr_npu.ReinstallAfterApply)


def test_order_rr_before_mindspeeds_first_patch() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel():
        rr_npu.install()
        try:
            with mindspeed() as ms:
                ms.import_adaptor()
                ms.repatch()
                _round_trip()  # attach re-checks: the manager is hooked from here on
                assert isinstance(ms.manager.apply_patches, rr_npu.ReinstallAfterApply)
                ms.repatch()
                assert rmc.is_installed()
                _round_trip()
        finally:
            rr_npu.uninstall()


def test_install_uninstall_state_machine_under_mindspeed() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True) as ms:
        rr_npu.install()
        rr_npu.install()  # twice: nothing doubled
        router = _mod("transformer.moe.router").TopKRouter
        _rr_proxy(router, "routing")
        rr_npu.uninstall()
        rr_npu.uninstall()
        assert not rmc.installed_hooks()
        ms.repatch()  # no rr hook comes back once uninstalled
        assert not rmc.installed_hooks()


def test_mla_config_with_flag_and_rr_owned_copies() -> None:
    """MLATransformerConfig with the flag: TypeError on plain 0.12, accepted under MindSpeed;
    rr's copies (replace, plain data across processes) keep the flag and MindSpeed's args."""
    from rr_fakes.megatron import model_parallel

    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2}
    with model_parallel():
        tc = _mod("transformer.transformer_config")
        if not rmc.megatron_line().native_replay:
            with pytest.raises(TypeError):
                tc.MLATransformerConfig(moe_enable_routing_replay=True, **kwargs)
        with mindspeed(import_adaptor=True, args={"use_fused_rmsnorm": True}):
            cfg = tc.MLATransformerConfig(moe_enable_routing_replay=True, **kwargs)
            assert cfg.moe_enable_routing_replay is True
            assert type(cfg).__module__ == "types"
            rr_npu.enable_replay(cfg)
            assert rmc.replay_enabled(cfg)
            cfg.set_after_construction = 7
            with pytest.raises((pickle.PicklingError, AttributeError)):
                pickle.dumps(cfg)
            copy = rr_npu.replace_config(cfg, num_layers=4)
            assert copy.num_layers == 4
            assert copy.moe_enable_routing_replay is True
            assert (copy.use_fused_rmsnorm, copy.set_after_construction) == (True, 7)
            plain = pickle.loads(pickle.dumps(rr_npu.config_to_plain(cfg)))
            assert plain["class"].endswith(":MLATransformerConfig")
            rebuilt = rr_npu.config_from_plain(plain)
            assert rebuilt.moe_enable_routing_replay is True
            assert isinstance(rebuilt, tc.MLATransformerConfig)
            assert rmc.replay_enabled(rebuilt)


def test_no_class_level_flag_and_signatures_preserved() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True):
        tc = _mod("transformer.transformer_config")
        rr_npu.install()
        try:
            for klass in (tc.TransformerConfig, tc.MLATransformerConfig):
                assert "num_layers" in inspect.signature(klass).parameters
                flag = vars(klass).get("moe_enable_routing_replay", False)
                assert flag is False  # only Megatron's own field default, never True
        finally:
            rr_npu.uninstall()


def test_hidden_config_signature_is_refused() -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True):
        tc = _mod("transformer.transformer_config")
        mindspeed_init = tc.TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kw: Any) -> None:  # no functools.wraps
            mindspeed_init(self, *args, **kw)

        tc.TransformerConfig.__init__ = careless_init
        with pytest.raises(rr_npu.ConfigSignatureError, match=r"functools\.wraps"):
            rr_npu.install()
        rr_npu.uninstall()


@pytest.mark.parametrize(
    ("feature", "match"), [("moe_tp_extend_ep", "moe_tp_extend_ep"), ("fix_router", "fix_router")]
)
def test_routing_replacing_features_are_refused(feature: str, match: str) -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True, **{feature: True}):
        with pytest.raises(rr_npu.RoutingReplacedError, match=match):
            rr_npu.install()
        rr_npu.uninstall()


def test_feature_turned_on_by_repatch_is_refused() -> None:
    from rr_fakes.megatron import TinyGPTConfig, model_parallel, transformer_config

    with model_parallel(), mindspeed(import_adaptor=True) as ms:
        rr_npu.install()
        try:
            with pytest.raises(rr_npu.RoutingReplacedError, match="fix_router"):
                ms.repatch({"fix_router": True})
            config = transformer_config(TinyGPTConfig(extra=_extra()))
            assert config.fix_router is True  # MindSpeed merged it into the config
            with pytest.raises(rr_npu.RoutingReplacedError):
                rr_npu.enable_replay(config)
        finally:
            rr_npu.uninstall()


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(
            {"moe_aux_loss_coeff": 1e-2, "moe_router_load_balancing_type": "aux_loss"},
            id="aux-loss",
        ),
        pytest.param({"moe_router_num_groups": 2, "moe_router_group_topk": 1}, id="group-topk"),
        pytest.param(
            {"moe_expert_capacity_factor": 1.0, "moe_token_drop_policy": "probs"},
            id="token-dropping",
        ),
    ],
)
def test_line_guarantees_hold_under_mindspeed(extra: dict[str, Any]) -> None:
    from rr_fakes.megatron import model_parallel

    with model_parallel(), mindspeed(import_adaptor=True):
        rr_npu.install()
        try:
            _round_trip(extra, capacity="allow")
        finally:
            rr_npu.uninstall()


def test_offsets_are_for_the_requested_stage_not_the_global_rank() -> None:
    """0.12's offset functions read the global pipeline rank; under MindSpeed on a rank-0
    process (a driver, a checkpoint converter) a patch that falls back to it computes every
    stage's layers as stage 0's. rr derives each stage's layers from the config."""
    import torch

    from rr_core import stage_layer_numbers, stage_moe_layer_numbers
    from rr_fakes.megatron import model_parallel
    from rr_megatron_compat import layout_config

    kwargs: dict[str, Any] = {
        "num_layers": 8,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_moe_experts": 4,
        "moe_router_topk": 2,
        "add_bias_linear": False,
        "moe_layer_freq": [0, 1, 1, 0, 1, 1, 1, 1],
        "pipeline_model_parallel_size": 4,
        "pipeline_dtype": torch.float32,
        "num_layers_in_first_pipeline_stage": 1,
        "num_layers_in_last_pipeline_stage": 3,
    }
    with model_parallel(), mindspeed(import_adaptor=True):
        tc = _mod("transformer.transformer_config")
        cfg = tc.TransformerConfig(**kwargs)
        assert type(cfg).__module__ == "types"  # rebuilt by MindSpeed
        layout = layout_config(cfg)
        stages = [stage_layer_numbers(layout, rank) for rank in range(4)]
        assert stages == [(1,), (2, 3), (4, 5), (6, 7, 8)]
        assert [stage_moe_layer_numbers(layout, r) for r in range(4)] == [
            (),
            (2, 3),
            (5,),
            (6, 7, 8),
        ]
        ps, block = _mod("parallel_state"), _mod("transformer.transformer_block")
        assert ps.get_pipeline_model_parallel_rank() == 0  # the global rank of this process
        offset_fn = _mod("transformer.transformer_layer").get_transformer_layer_offset
        ps.set_pipeline_model_parallel_world_size(4)
        try:
            for rank, layers in enumerate(stages):
                ps.set_pipeline_model_parallel_rank(rank)  # what Megatron reads on 0.12
                count = block.get_num_layers_to_build(cfg)
                assert (offset_fn(cfg) + 1, count) == (layers[0], len(layers))
        finally:
            ps.set_pipeline_model_parallel_rank(0)
            ps.set_pipeline_model_parallel_world_size(1)
