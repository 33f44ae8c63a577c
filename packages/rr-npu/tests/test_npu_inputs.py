"""Every public entry point of rr_npu checks its arguments up front (torch only): a bad type,
dtype, device string, backend or flag raises a typed rr error naming what came."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch

import rr_npu
from rr_core import ReplayController, ReplayError, RRError
from rr_fakes.pytest_support import BadCall, over_bad_calls, raised_by
from rr_megatron_compat import ReplayConfigError
from rr_npu import DeviceChoiceError

IDS = torch.zeros((4, 2), dtype=torch.int16)
PLAIN = {"fields": {}, "extra": {}}


def _controller() -> ReplayController:
    return ReplayController(num_experts=4, top_k=2)


def _attach_installed(controller: ReplayController, model: Any, **options: Any) -> Any:
    """``rr_npu.attach`` after ``rr_npu.install()`` (attach before install is refused first;
    install needs a megatron-core, which the core session has not)."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("rr_npu.install() needs megatron-core")
    rr_npu.install()
    try:
        return rr_npu.attach(controller, model, **options)
    finally:
        rr_npu.uninstall()


CASES: list[BadCall] = [
    (
        "wire_plan int backend",
        lambda: rr_npu.wire_plan(torch.int16, 5),
        rr_npu.PayloadPolicyError,
        "'hccl', 'nccl' or 'gloo'",
    ),
    (
        "wire_plan unknown backend",
        lambda: rr_npu.wire_plan(torch.int16, "tpu"),
        rr_npu.PayloadPolicyError,
        "'tpu'",
    ),
    (
        "wire_plan int64",
        lambda: rr_npu.wire_plan(torch.int64, "hccl"),
        rr_npu.PayloadPolicyError,
        "got int64",
    ),
    (
        "all_gather_routes list",
        lambda: rr_npu.all_gather_routes([1, 2], backend="gloo"),
        rr_npu.PayloadPolicyError,
        "torch.Tensor",
    ),
    (
        "all_gather_routes float",
        lambda: rr_npu.all_gather_routes(IDS.float(), backend="gloo"),
        rr_npu.PayloadPolicyError,
        "integer route ids",
    ),
    (
        "all_gather_routes int backend",
        lambda: rr_npu.all_gather_routes(IDS, backend=1),
        rr_npu.PayloadPolicyError,
        "backend",
    ),
    (
        "ids_for_gather str",
        lambda: rr_npu.ids_for_gather("x"),
        rr_npu.PayloadPolicyError,
        "torch.Tensor",
    ),
    (
        "ids_for_gather float",
        lambda: rr_npu.ids_for_gather(IDS.float()),
        rr_npu.PayloadPolicyError,
        "float32",
    ),
    (
        "ids_for_gather bool",
        lambda: rr_npu.ids_for_gather(IDS.bool()),
        rr_npu.PayloadPolicyError,
        "bool",
    ),
    (
        "device_choice upper case",
        lambda: rr_npu.device_choice("NPU"),
        DeviceChoiceError,
        "exact, lower case",
    ),
    (
        "device_choice int",
        lambda: rr_npu.device_choice(1),
        DeviceChoiceError,
        "got 1 (from prefer)",
    ),
    (
        "DeviceChoice.device str",
        lambda: rr_npu.device_choice("cpu").device("0"),
        DeviceChoiceError,
        "device index must be an int",
    ),
    (
        "DeviceChoice.device negative",
        lambda: rr_npu.device_choice("cpu").device(-1),
        DeviceChoiceError,
        ">= 0",
    ),
    (
        "set_npu_determinism str",
        lambda: rr_npu.set_npu_determinism(torch_deterministic="no"),
        ReplayError,
        "True or False",
    ),
    ("watch str", lambda: rr_npu.watch("ctl"), ReplayError, "rr_core.ReplayController"),
    ("detach str", lambda: rr_npu.detach("ctl"), ReplayError, "rr_core.ReplayController"),
    (
        "attach str controller",
        lambda: rr_npu.attach("ctl", torch.nn.Linear(1, 1)),
        ReplayError,
        "rr_core.ReplayController",
    ),
    ("attach str model", lambda: rr_npu.attach(_controller(), "model"), ReplayError, "nn.Module"),
    (
        "attach capacity",
        lambda: _attach_installed(_controller(), torch.nn.Linear(1, 1), capacity="x"),
        ReplayConfigError,
        "capacity",
    ),
    ("install force str", lambda: rr_npu.install(force="yes"), ReplayError, "True or False"),
    (
        "enable_replay capacity",
        lambda: rr_npu.enable_replay(object(), capacity="x"),
        ReplayConfigError,
        "capacity",
    ),
    (
        "config_to_plain object",
        lambda: rr_npu.config_to_plain(object()),
        ReplayConfigError,
        "dataclass",
    ),
    (
        "config_from_plain str",
        lambda: rr_npu.config_from_plain("x"),
        ReplayConfigError,
        "config_to_plain returns",
    ),
    (
        "config_from_plain module",
        lambda: rr_npu.config_from_plain({"class": "os:path", **PLAIN}),
        ReplayConfigError,
        "not a config class",
    ),
    (
        "config_from_plain missing",
        lambda: rr_npu.config_from_plain({"class": "no_such_module_rr:X", **PLAIN}),
        ReplayConfigError,
        "cannot be imported",
    ),
    (
        "config_from_plain fields",
        lambda: rr_npu.config_from_plain({"class": "os:path", "fields": [], "extra": {}}),
        ReplayConfigError,
        "data['fields']",
    ),
]


@over_bad_calls(CASES)
def test_bad_arguments_raise_a_typed_rr_error(
    call: Callable[[], Any], error: type[Exception], fragment: str
) -> None:
    assert isinstance(raised_by(call, error, fragment), RRError)


def test_errors_keep_their_older_bases() -> None:
    """Callers that caught ValueError / ImportError keep working."""
    assert issubclass(rr_npu.PayloadPolicyError, ValueError)
    assert issubclass(DeviceChoiceError, ValueError)
    assert issubclass(rr_npu.NpuUnavailableError, ImportError)
    assert issubclass(rr_npu.NpuUnavailableError, RRError)


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu here")
def test_missing_torch_npu_is_an_rr_error() -> None:
    with pytest.raises(RRError, match="CANN"):
        rr_npu.import_torch_npu()
