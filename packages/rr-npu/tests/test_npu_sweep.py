"""Property sweep over rr_npu's torch-only entry points on generated input, valid or not: each
call returns a result that passes its own invariant or raises an RRError subclass, never a bare
IndexError/RuntimeError/KeyError/TypeError from inside, never a silently wrong answer.

Entry points covered:

- ``wire_plan`` (every dtype over every backend name, and odd values), ``ids_for_gather``
- ``all_gather_routes`` argument checks (no process group here, so every call must be refused;
  the gather itself is the two-process test's)
- ``device_choice`` (``prefer`` of any value; CPU host), ``set_npu_determinism`` flag check
- ``config_to_plain`` / ``config_from_plain`` (round trip of a plain config; odd data),
  ``enable_replay`` of a non-config
- ``watch``, ``attach``, ``detach``, ``install`` argument checks
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rr_npu
from rr_core import ReplayController
from rr_fakes.pytest_support import settles
from rr_fakes.sweeps import JUNK, SWEEP, adapter_refuses, public_api_tests

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.complex64,
]  # fmt: skip


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    values = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 1)))
    return torch.from_numpy(values).to(dtype)


@SWEEP
@given(
    dtype=st.one_of(st.sampled_from(DTYPES), st.sampled_from(["int16", "torch.int16"]), JUNK),
    backend=st.one_of(st.sampled_from(["hccl", "nccl", "gloo", "HCCL", "mpi", ""]), JUNK),
)
def test_wire_plan(dtype: Any, backend: Any) -> None:
    ok, plan = settles(rr_npu.wire_plan, dtype, backend)
    if ok:
        assert plan.backend in ("hccl", "nccl", "gloo")
        assert plan.wire_dtype == "uint8" or plan.wire_dtype == plan.payload_dtype
        assert plan.byte_view == (plan.wire_dtype != plan.payload_dtype)
        if plan.backend == "hccl":
            assert plan.wire_dtype in rr_npu.HCCL_COLLECTIVE_DTYPES


@SWEEP
@given(ids=st.one_of(tensors(), JUNK))
def test_ids_for_gather(ids: Any) -> None:
    ok, out = settles(rr_npu.ids_for_gather, ids)
    if ok:
        assert out.dtype == torch.int64
        assert torch.equal(out, ids.to(torch.int64))
        assert not ids.dtype.is_floating_point
        assert not ids.dtype.is_complex


@SWEEP
@given(
    ids=st.one_of(tensors(), JUNK),
    backend=st.one_of(st.none(), st.sampled_from(["hccl", "gloo", "mpi"]), JUNK),
    group=st.one_of(st.none(), JUNK),
)
def test_all_gather_arguments(ids: Any, backend: Any, group: Any) -> None:
    """No process group here: every call is refused, a valid payload for want of a group."""
    ok, _ = settles(rr_npu.all_gather_routes, ids, group, backend=backend)
    assert not ok


@SWEEP
@given(prefer=st.one_of(st.none(), st.sampled_from(["cpu", "cuda", "npu", "tpu", "CPU"]), JUNK))
def test_device_choice(prefer: Any) -> None:
    ok, choice = settles(rr_npu.device_choice, prefer)
    if ok:
        assert choice.device_type in ("cpu", "cuda", "npu")
        if prefer is not None:
            assert choice.device_type == prefer.lower()


@SWEEP
@given(flag=JUNK)
def test_determinism_flag(flag: Any) -> None:
    if isinstance(flag, bool):
        return  # a real flag would change this process's torch settings
    ok, _ = settles(rr_npu.set_npu_determinism, torch_deterministic=flag)
    assert not ok


@dataclasses.dataclass
class Config:
    num_layers: int = 2
    hidden_size: int = 4


@SWEEP
@given(
    layers=st.integers(1, 5),
    extra=st.one_of(st.none(), st.integers(), st.text(max_size=3)),
    data=st.one_of(JUNK, st.just({"fields": {}})),
    changes=st.dictionaries(
        st.sampled_from(["num_layers", "bogus"]), st.integers(1, 3), max_size=1
    ),
)
def test_config_plain(layers: int, extra: Any, data: Any, changes: dict[str, int]) -> None:
    config = Config(num_layers=layers)
    config.rr_note = extra  # type: ignore[attr-defined]
    ok, plain = settles(rr_npu.config_to_plain, config)
    if ok:
        ok, back = settles(rr_npu.config_from_plain, plain, **changes)
        if ok:
            assert type(back) is Config
            assert back.num_layers == changes.get("num_layers", layers)
            assert back.rr_note == extra  # type: ignore[attr-defined]
        else:
            assert "bogus" in changes
    settles(rr_npu.config_from_plain, data)
    settles(rr_npu.config_to_plain, data)
    settles(rr_npu.enable_replay, data)


@SWEEP
@given(
    controller=st.one_of(st.just("real"), JUNK),
    model=st.sampled_from(["module", "none", "str"]),
    force=st.one_of(st.booleans(), JUNK),
)
def test_adapter_arguments(controller: Any, model: str, force: Any) -> None:
    ctrl = ReplayController(num_experts=4, top_k=2) if controller == "real" else controller
    if controller != "real":
        ok, _ = settles(rr_npu.watch, ctrl)
        assert not ok
    the_model: Any = {"module": torch.nn.Linear(2, 2), "none": None, "str": "m"}[model]
    adapter_refuses(rr_npu, ctrl, the_model, force)


#: The entry points the sweeps above drive with generated batches and layouts, checking their
#: invariant.
SWEPT_ABOVE = (
    "all_gather_routes", "attach", "config_from_plain", "config_to_plain", "detach",
    "device_choice", "device_type", "enable_replay", "ids_for_gather", "install",
    "set_npu_determinism", "watch", "wire_plan",
)  # fmt: skip
#: Entry points whose invariant on arguments of any kind is "a result or an rr error".
SWEPT_WITH_JUNK = (
    "check_routing_not_replaced", "declared_class", "replace_config", "routing_replacements",
    "check_config_signatures", "check_import_order", "collective_backend", "replay_active",
    "visible_devices_var", "import_torch_npu",
)  # fmt: skip
#: Public names that take no outside data, or whose checks another test drives.
NOT_SWEPT_HERE = {
    **dict.fromkeys(
        ("ADAPTER", "MindSpeedAdapter", "is_installed", "uninstall"),
        "the adapter protocol (tests/test_adapter_protocol.py): junk controllers and models",
    ),
    **dict.fromkeys(
        (
            "ensure_installed",
            "install_gating_guard",
            "uninstall_gating_guard",
            "ReinstallAfterApply",
        ),
        "install state under MindSpeed and torch_npu: test_npu_mindspeed.py, test_npu_gating.py",
    ),
    **dict.fromkeys(
        ("DeterminismReport", "DeviceChoice", "Replacement", "WirePlan"), "a record rr returns"
    ),
    **dict.fromkeys(("HCCL_COLLECTIVE_DTYPES", "NPU_DETERMINISM_ENV", "SUPPORTED"), "a constant"),
    **dict.fromkeys(
        (
            "ConfigSignatureError",
            "DeviceChoiceError",
            "FusedGatingError",
            "MindSpeedOrderError",
            "NpuUnavailableError",
            "PayloadPolicyError",
            "RoutingReplacedError",
        ),
        "an error class",
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rr_npu,
    swept_above=SWEPT_ABOVE,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_SWEPT_HERE,
)
