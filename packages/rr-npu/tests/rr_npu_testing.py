"""Helpers of the rr-npu tests (a unique module name, so test runs across packages cannot pick up
another package's conftest)."""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

FRESH = "RR_NPU_FRESH_PROCESS"


def mindspeed_unavailable() -> str | None:
    """Why the MindSpeed emulation cannot run here (no megatron-core, or a release MindSpeed
    has no line for), or None."""
    from rr_fakes.emulations.mindspeed import installed_line
    from rr_fakes.shims.megatron import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return reason
    try:
        installed_line()
    except ValueError as error:
        return str(error)
    return None


def in_fresh_process(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` in a fresh interpreter: the torch_npu emulation renames PrivateUse1 to
    "npu" for the rest of its process, and torch.compile (used by megatron-core 0.16+) then
    fails on a device name without a ``torch.npu`` module."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        if os.environ.get(FRESH) == test.__name__:
            test(*args, **kwargs)
            return
        node = f"{inspect.getfile(test)}::{test.__name__}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, FRESH: test.__name__},
            check=False,
        )
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]

    return wrapper


def round_trip(extra: dict[str, Any] | None = None, capacity: str = "warn") -> dict[int, float]:
    """Build a tiny GPTModel (config rebuilt by MindSpeed), record one step, replay it with the
    router weights moved; returns the per-layer agreement (every layer must be 1.0)."""
    import inspect as _inspect

    import torch

    import rr_megatron_compat as rmc
    import rr_npu
    from rr_core import ReplayController, ReplayMode
    from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, gpt_inputs, train_step

    model = build_gpt(TinyGPTConfig(extra={**rmc.replay_config_fields(), **(extra or {})}))
    config = model.config
    assert type(config).__module__ == "types"  # the per-instance class MindSpeed generates
    assert "num_layers" in _inspect.signature(type(config)).parameters
    assert config.kv_channels == config.hidden_size // config.num_attention_heads
    assert rmc.replay_enabled(config)
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
        with torch.no_grad():  # moved weights: the native choice changes, replay must not
            for name, param in model.named_parameters():
                if "router" in name:
                    param.add_(torch.randn_like(param))
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, routes, layer_numbers=controller.layer_numbers)
        maps, handles = _routing_maps(model)
        train_step([model], [batch])
        for handle in handles:
            handle.remove()
        agreement = controller.end_step().agreement
    finally:
        rr_npu.detach(controller)
    for slot, (layer, routing_map) in enumerate(sorted(maps.items())):
        ids = routes[:, slot].long()
        recorded = torch.zeros_like(routing_map).scatter(1, ids, True)
        if (extra or {}).get("moe_expert_capacity_factor") is None:
            assert torch.equal(routing_map, recorded), f"layer {layer}"
        else:  # token dropping after the replayed selection (C3): only recorded experts kept
            assert not (routing_map & ~recorded).any(), f"layer {layer}"
    assert set(agreement) == {1, 2, 3, 4}
    assert min(agreement.values()) < 1.0
    return agreement


def _routing_maps(model: Any) -> tuple[dict[int, Any], list[Any]]:
    """The routing map each router returns in the next forward, by layer number, and the hook
    handles to remove afterwards."""
    maps: dict[int, Any] = {}
    handles = []
    for module in model.modules():
        if type(module).__name__ == "TopKRouter":

            def keep(mod: Any, args: Any, out: Any, layer: int = module.layer_number) -> None:
                maps.setdefault(layer, out[1].detach().clone())

            handles.append(module.register_forward_hook(keep))
    return maps, handles


def rr_first_then_mindspeed() -> None:
    """rr_npu.install() in a process without Megatron, then MindSpeed's adaptor (pre-patches
    included), then the model: install must not import Megatron, and replay is exact."""
    import rr_npu
    from rr_fakes.emulations.mindspeed import dummy_compile, emulated_mindspeed
    from rr_fakes.shims.megatron import model_parallel

    rr_npu.install()
    assert not [m for m in sys.modules if m.startswith("megatron")], "install imported Megatron"
    try:
        with emulated_mindspeed(import_adaptor=True), model_parallel():
            jit = sys.modules["megatron.core.jit"]
            assert jit.jit_fuser is dummy_compile  # the pre-patch came before Megatron's import
            round_trip()
            assert rr_npu.is_installed()
    finally:
        rr_npu.uninstall()
    print("RR-FIRST-OK")


def megatron_first_then_mindspeed() -> None:
    """Megatron imported before MindSpeed's pre-patches: attach names the order and the fix."""
    import importlib

    import rr_megatron_compat as rmc
    import rr_npu
    from rr_core import ReplayController
    from rr_fakes.emulations.mindspeed import emulated_mindspeed
    from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, model_parallel

    with model_parallel():  # imports Megatron (and binds jit_fuser = torch.compile)
        for name in ("models.gpt.gpt_layer_specs", "models.gpt.gpt_model"):  # all of what builds
            importlib.import_module(f"megatron.core.{name}")  # the model, before the dummies
        rr_npu.install()  # no MindSpeed yet: nothing to refuse
        try:
            with emulated_mindspeed(import_adaptor=True):
                model = build_gpt(TinyGPTConfig(extra=rmc.replay_config_fields()))
                try:
                    rr_npu.attach(ReplayController(num_experts=8, top_k=2), model)
                except rr_npu.MindSpeedOrderError as error:
                    print("ORDER-REFUSED", error)
                else:
                    raise AssertionError("attach accepted Megatron imported before MindSpeed")
        finally:
            rr_npu.uninstall()


def run_script(name: str) -> str:
    """Run one of the functions above in a fresh interpreter; returns its stdout."""
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-c", f"import rr_npu_testing as t; t.{name}()"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=here,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    return done.stdout
