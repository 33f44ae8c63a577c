"""Replay under the emulated MindSpeed (the line matching the installed megatron-core), on real
megatron-core.

Real-world failures guarded against: MindSpeed's ``repatch()`` (an engine calls it at the end of
its constructor) dropping rr's hooks; the per-instance TransformerConfig rebuild stripping a
replay flag or every field; ``dataclasses.replace`` / pickling of rebuilt configs; MindSpeed
replacements of routing bypassing replay hooks, and false refusals where nothing replaces
routing (wrapper-only registrations, entries a repatch left with ``patch_func=None``, flags no
feature reads); rr installed before MindSpeed importing Megatron ahead of its pre-patches;
replay patches for newer Megatron crashing on 0.12 (C6).

This process imported Megatron before any emulation, so MindSpeed's pre-patches would come too
late here (``pre_patches=False``); the two orders where they matter run in fresh interpreters.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import rr_megatron_compat as rmc
import rr_npu
from rr_core.patching import raw_attribute
from rr_fakes.emulations.mindspeed import Feature
from rr_npu_testing import mindspeed_unavailable, round_trip, run_script

REASON = mindspeed_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
ROUTING = "megatron.core.transformer.moe.router.TopKRouter.routing"
TOPK = "megatron.core.transformer.moe.moe_utils.topk_softmax_with_capacity"
MOE_LAYER = "megatron.core.transformer.moe.moe_layer.MoELayer"


def _mod(name: str) -> Any:
    return importlib.import_module(f"megatron.core.{name}")


def _line() -> tuple[int, int]:
    return rmc.megatron_line().version.release[:2]  # type: ignore[return-value]


class WrapperOnly(Feature):
    """A feature that only stacks a pass-through on ``targets`` (no ``functools.wraps``, so only
    MindSpeed's record says it calls the original)."""

    def __init__(self, *targets: str) -> None:
        super().__init__("test-wrapper", 0)
        self.targets = targets

    def register_patches(self, pm: Any, args: Any) -> None:
        for target in self.targets:

            def passthrough_wrapper(fn: Any) -> Any:
                def wrapped(*a: Any, **kw: Any) -> Any:
                    return fn(*a, **kw)

                return wrapped

            pm.register_patch(target, passthrough_wrapper)


@contextmanager
def mindspeed(*, wrappers: tuple[str, ...] = (ROUTING,), **kwargs: Any) -> Iterator[Any]:
    """The emulation of this line without its pre-patches; ``wrappers`` get a pass-through
    registered (on ``TopKRouter.routing`` by default: an attribute rr hooks, so a repatch
    really drops rr's proxy)."""
    from rr_fakes.emulations.mindspeed import emulated_mindspeed
    from rr_fakes.shims.megatron import model_parallel

    import_adaptor = kwargs.pop("import_adaptor", True)
    with model_parallel(), emulated_mindspeed(pre_patches=False, **kwargs) as ms:
        if wrappers:
            ms.features.append(WrapperOnly(*wrappers))
        if import_adaptor:
            ms.import_adaptor()
        yield ms


@contextmanager
def installed() -> Iterator[None]:
    rr_npu.install()
    try:
        yield
    finally:
        rr_npu.uninstall()


def _rr_proxy(owner: Any, name: str) -> Any:
    from rr_core.patching import wrapper_chain

    found = [p for p in wrapper_chain(raw_attribute(owner, name)) if isinstance(p, rmc.RRProxy)]
    active = [p for p in found if p._self_rr_active]
    assert len(active) == 1, found
    return active[0]


# -- orders -------------------------------------------------------------------------------------
def test_order_mindspeed_adaptor_first() -> None:
    with mindspeed() as ms, installed():
        assert ms.patch(ROUTING).patch_func is None
        assert ms.patch(ROUTING).wrappers
        assert rmc.is_installed()
        round_trip()


def test_order_rr_first_then_repatch_reinstalls_dropped_hooks() -> None:
    with mindspeed() as ms, installed():
        router = _mod("transformer.moe.router").TopKRouter
        before = _rr_proxy(router, "routing")
        ms.repatch({"some_engine_flag": 1})  # wrapper(first_original): rr's proxy dropped
        after = _rr_proxy(router, "routing")  # put back right after each of the two applies
        assert after is not before
        with pytest.warns(DeprecationWarning, match=r"call rr_npu.install\(\) again"):
            assert rr_npu.ensure_installed() == ()  # the name of earlier releases
        round_trip()
    assert not isinstance(raw_attribute(ms.manager, "apply_patches"), rr_npu.ReinstallAfterApply)


def test_order_rr_installed_before_mindspeeds_first_patch() -> None:
    with mindspeed(import_adaptor=False) as ms, installed():
        ms.import_adaptor()
        ms.repatch()
        round_trip()  # attach re-checks: the manager is hooked from here on
        assert isinstance(raw_attribute(ms.manager, "apply_patches"), rr_npu.ReinstallAfterApply)
        ms.repatch()
        assert rmc.is_installed()
        round_trip()


def test_install_before_mindspeed_imports_no_megatron_and_replays() -> None:
    """Fresh process: install first, MindSpeed's pre-patches (torch.compile) before Megatron."""
    assert "RR-FIRST-OK" in run_script("rr_first_then_mindspeed")


def test_megatron_imported_before_mindspeed_is_refused_by_name() -> None:
    """Fresh process; on 0.12 / 0.16 MindSpeed's own torch.compile pre-patch shows the order,
    on 0.17 / 0.18 (no pre-patch registered) the MegatronAdaptor imported after megatron.core."""
    out = run_script("megatron_first_then_mindspeed")
    assert "ORDER-REFUSED" in out
    for part in ("jit_fuser", "mindspeed.megatron_adaptor", "`rr explain C8`"):
        assert part in out
    shown = "megatron_adaptor, which" if _line() >= NEW_LINES else "MindSpeed replaced"
    assert shown in out


def test_install_uninstall_state_machine_under_mindspeed() -> None:
    with mindspeed() as ms:
        rr_npu.install()
        rr_npu.install()  # twice: nothing doubled
        _rr_proxy(_mod("transformer.moe.router").TopKRouter, "routing")
        rr_npu.uninstall()
        rr_npu.uninstall()
        assert not rmc.ADAPTER.installed_hooks()
        ms.repatch()  # no rr hook comes back once uninstalled
        assert not rmc.ADAPTER.installed_hooks()


# -- what routes ----------------------------------------------------------------------------------
def test_wrapper_only_registrations_are_accepted_and_replay_exactly() -> None:
    router_copy = "megatron.core.transformer.moe.router.topk_softmax_with_capacity"
    targets = (ROUTING, TOPK, router_copy) if _line() < (0, 14) else (ROUTING,)  # 0.14+: gone
    with mindspeed(wrappers=targets) as ms, installed():
        for target in targets:
            record = ms.patch(target)
            assert record.patch_func is None
            assert record.wrappers
            assert record.is_applied
        assert rr_npu.routing_replacements() == []
        round_trip()


def test_the_pass_through_marks_on_mindspeeds_functions_come_off_with_uninstall() -> None:
    with mindspeed() as ms:
        record = ms.patch(ROUTING)
        final = record.final_patch_func
        assert "__wrapped__" not in vars(final)  # the pass-through MindSpeed stacked keeps none
        with installed():
            assert final.__wrapped__ is record.orig_func  # how rr sees its hook under it
        assert "__wrapped__" not in vars(final)


TP_EXTEND_EP_ARGS = {"moe_permutation_async_comm": True, "moe_grouped_gemm": True}
NEW_LINES = (0, 17)  # MindSpeed's 0.17 / 0.18 lines cannot import moe_tp_extend_ep


@pytest.mark.skipif(_line() < (0, 16) if REASON is None else True, reason="megatron-core 0.16+")
def test_tp_extend_ep_is_refused_where_megatron_passes_padding_mask() -> None:
    if _line() >= NEW_LINES:
        pytest.skip("MindSpeed's 0.17 / 0.18 lines cannot import moe_tp_extend_ep")
    with mindspeed(moe_tp_extend_ep=True, args=TP_EXTEND_EP_ARGS) as ms:
        assert ms.patch(ROUTING).patch_func is not None
        assert ms.patch(MOE_LAYER).patch_func is not None  # MoELayer is replaced too
        with pytest.raises(rr_npu.RoutingReplacedError) as caught:
            rr_npu.install()
        rr_npu.uninstall()
    message = str(caught.value)
    for part in ("moe_tp_extend_ep", ROUTING, "routing_tp_extend_ep", "padding_mask", "C7"):
        assert part in message
    assert "TypeError" in message


@pytest.mark.skipif(_line() >= (0, 13) if REASON is None else True, reason="MindSpeed 0.12 line")
def test_tp_extend_ep_on_012_is_accepted_with_aux_loss_and_refused_where_it_bypasses() -> None:
    with mindspeed(moe_tp_extend_ep=True, args=TP_EXTEND_EP_ARGS) as ms, installed():
        assert ms.patch(ROUTING).patch_func.__name__ == "routing_tp_extend_ep"
        assert rr_npu.routing_replacements() == []  # aux_loss: Megatron's top-k, rr's hook
        router = _mod("transformer.moe.router").TopKRouter
        _rr_proxy(router, "routing")  # rr's proxy over MindSpeed's replacement
        for kind, part in (("none", "own import"), ("sinkhorn", "sinkhorn"), ("x", "ValueError")):
            ms.args.moe_router_load_balancing_type = kind
            with pytest.raises(rr_npu.RoutingReplacedError, match=part):
                rr_npu.check_routing_not_replaced()


@pytest.mark.skipif(_line() >= (0, 13) if REASON is None else True, reason="MindSpeed 0.12 line")
def test_tp_extend_ep_on_012_with_aux_loss_replays_exactly_and_none_is_refused_at_attach() -> None:
    """MindSpeed's replacement (its validation wants num_experts, async permutation and
    grouped GEMM; its MoELayer brings its own experts) under rr's proxy: aux_loss reaches rr's
    top-k hook, so the round trip is exact; a config routing with 'none' is refused."""
    args = {"num_experts": 8, **TP_EXTEND_EP_ARGS}
    seq = {"moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall_seq"}
    aux = {"moe_aux_loss_coeff": 1e-2, "moe_router_load_balancing_type": "aux_loss"}
    with mindspeed(moe_tp_extend_ep=True, args=args) as ms, installed():
        round_trip({**seq, **aux})
        assert "TopKRouter.routing" in ms.bypass_calls  # MindSpeed's routing ran
        layer = _mod("transformer.moe.moe_layer").MoELayer
        assert layer.__name__ == "MindSpeedAlltoAllSEQTptoEpMoELayer"
        from rr_core import ReplayController
        from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt

        none = {**rmc.replay_config_fields(), **seq, "moe_router_load_balancing_type": "none"}
        model = build_gpt(TinyGPTConfig(extra=none))
        with pytest.raises(rr_npu.RoutingReplacedError, match="own import"):
            rr_npu.attach(ReplayController(num_experts=8, top_k=2), model)


@pytest.mark.skipif(_line() < NEW_LINES if REASON is None else True, reason="MindSpeed 0.17+")
def test_tp_extend_ep_cannot_import_on_017_and_018() -> None:
    with pytest.raises(ModuleNotFoundError, match="legacy_a2a_token_dispatcher"):  # noqa: SIM117
        with mindspeed(moe_tp_extend_ep=True, args=TP_EXTEND_EP_ARGS):
            pass


def test_tp_extend_ep_needs_optimization_level_2() -> None:
    args = {"optimization_level": 1, "moe_permutation_async_comm": True}
    with mindspeed(moe_tp_extend_ep=True, args=args) as ms, installed():
        assert ms.patch(ROUTING).patch_func is None  # the feature did not apply
        assert rr_npu.routing_replacements() == []


def _bypassing() -> dict[str, Any]:
    """Global arguments under which moe_tp_extend_ep bypasses or breaks rr's hook here."""
    return {"moe_router_load_balancing_type": "none"} if _line() < (0, 16) else {}


@pytest.mark.skipif(_line() >= NEW_LINES if REASON is None else True, reason="0.12 / 0.16")
def test_repatch_dropping_tp_extend_ep_is_accepted_and_replays() -> None:
    args = {"moe_permutation_async_comm": True, **_bypassing()}
    with mindspeed(moe_tp_extend_ep=True, args=args) as ms:
        with pytest.raises(rr_npu.RoutingReplacedError):
            rr_npu.install()
        change = {"moe_tp_extend_ep": False, "moe_token_dispatcher_type": "alltoall"}
        ms.repatch({**change, "moe_router_load_balancing_type": "aux_loss"})
        record = ms.patch(ROUTING)
        assert record.patch_func is None
        assert record.orig_func_name == "routing"
        assert ms.patch(MOE_LAYER).patch_func is None
        with installed():
            round_trip()


def test_tp_extend_ep_turned_on_by_repatch_is_refused() -> None:
    with mindspeed(args=_bypassing()) as ms, installed():
        change = {"moe_tp_extend_ep": True, "moe_token_dispatcher_type": "alltoall_seq"}
        expected: Any = rr_npu.RoutingReplacedError
        if _line() >= NEW_LINES:
            expected = ModuleNotFoundError  # MindSpeed itself fails there
        with pytest.raises(expected, match=r"moe_tp_extend_ep|legacy_a2a"):
            ms.repatch({**change, "moe_permutation_async_comm": True})


@pytest.mark.skipif(_line() >= (0, 13) if REASON is None else True, reason="MindSpeed 0.12 line")
def test_capacity_factor_without_fix_router_is_refused_as_fix_router_on_012() -> None:
    with mindspeed(args={"moe_expert_capacity_factor": 1.0}) as ms:
        assert ms.args.fix_router is False
        assert ms.patch(TOPK).patch_func is not None
        with pytest.raises(rr_npu.RoutingReplacedError) as caught:
            rr_npu.install()
        rr_npu.uninstall()
    message = str(caught.value)
    for part in ("fix_router", "--moe-expert-capacity-factor", "moe_expert_capacity_factor=1.0"):
        assert part in message
    assert "fix_router=False" in message
    assert "`rr explain C7`" in message


@pytest.mark.skipif(_line() != (0, 16) if REASON is None else True, reason="MindSpeed 0.16 line")
def test_fix_router_flag_is_inert_on_016_and_replays() -> None:
    with mindspeed(fix_router=True) as ms, installed():
        assert TOPK not in ms.manager.patches_info  # core_r0.16.0 has no fix-router feature
        assert rr_npu.routing_replacements() == []
        round_trip()  # and its configs build with EP=1: no validation reads the flag


@pytest.mark.skipif(_line() < (0, 17) if REASON is None else True, reason="MindSpeed 0.17+")
def test_fix_router_registered_where_megatron_no_longer_calls_it_is_accepted() -> None:
    with mindspeed(fix_router=True) as ms, installed():
        assert ms.patch(TOPK).patch_func is not None
        assert ms.patch(TOPK).orig_func is None
        assert rr_npu.routing_replacements() == []


# -- configs --------------------------------------------------------------------------------------
def test_mla_config_with_flag_and_rr_owned_copies() -> None:
    """MLATransformerConfig with the flag: TypeError on plain 0.12, accepted under MindSpeed;
    rr's copies (replace, plain data across processes) keep the flag and MindSpeed's args."""
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2}
    if _line() == (0, 17):
        pytest.skip("core_r0.17.0 does not patch MLATransformerConfig.__init__")
    with mindspeed(args={"use_fused_rmsnorm": True}):
        tc = _mod("transformer.transformer_config")
        cfg = tc.MLATransformerConfig(moe_enable_routing_replay=True, **kwargs)
        assert cfg.moe_enable_routing_replay is True
        assert type(cfg).__module__ == "types"
        rr_npu.enable_replay(cfg)
        cfg.set_after_construction = 7
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(cfg)
        copy = rr_npu.replace_config(cfg, num_layers=4)
        assert (copy.num_layers, copy.moe_enable_routing_replay) == (4, True)
        assert (copy.use_fused_rmsnorm, copy.set_after_construction) == (True, 7)
        plain = pickle.loads(pickle.dumps(rr_npu.config_to_plain(cfg)))
        assert plain["class"].endswith(":MLATransformerConfig")
        rebuilt = rr_npu.config_from_plain(plain)
        assert isinstance(rebuilt, tc.MLATransformerConfig)
        assert rmc.replay_enabled(rebuilt)
        assert rr_npu.declared_class(cfg) is tc.MLATransformerConfig
        type(cfg).__module__ = tc.__name__  # Python 3.12+ names the caller's module, not types
        assert rr_npu.declared_class(cfg) is tc.MLATransformerConfig


def test_no_class_level_flag_and_signatures_preserved() -> None:
    with mindspeed(), installed():
        tc = _mod("transformer.transformer_config")
        for klass in (tc.TransformerConfig, tc.MLATransformerConfig):
            assert "num_layers" in inspect.signature(klass).parameters
            assert vars(klass).get("moe_enable_routing_replay", False) is False


def test_hidden_config_signature_is_refused() -> None:
    with mindspeed():
        tc = _mod("transformer.transformer_config")
        mindspeed_init = tc.TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kw: Any) -> None:  # no functools.wraps
            mindspeed_init(self, *args, **kw)

        tc.TransformerConfig.__init__ = careless_init
        with pytest.raises(rr_npu.ConfigSignatureError, match=r"functools\.wraps"):
            rr_npu.install()
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
    with mindspeed(), installed():
        round_trip(extra, capacity="allow")


def test_offsets_are_for_the_requested_stage_not_the_global_rank() -> None:
    """0.12's offset functions read the global pipeline rank; under MindSpeed on a rank-0
    process a patch that falls back to it computes every stage's layers as stage 0's. rr
    derives each stage's layers from the config."""
    import torch

    from rr_core import stage_layer_numbers, stage_moe_layer_numbers
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
    with mindspeed():
        cfg = _mod("transformer.transformer_config").TransformerConfig(**kwargs)
        assert type(cfg).__module__ == "types"  # rebuilt by MindSpeed
        layout = layout_config(cfg)
        stages = [stage_layer_numbers(layout, rank) for rank in range(4)]
        assert stages == [(1,), (2, 3), (4, 5), (6, 7, 8)]
        moe = [stage_moe_layer_numbers(layout, r) for r in range(4)]
        assert moe == [(), (2, 3), (5,), (6, 7, 8)]
        ps, block = _mod("parallel_state"), _mod("transformer.transformer_block")
        assert ps.get_pipeline_model_parallel_rank() == 0
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
