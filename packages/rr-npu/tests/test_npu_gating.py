"""The fused gating guard.

Real-world failure guarded against: ``torch_npu.npu_moe_gating_top_k`` (vllm-ascend routes
through it; it takes no forced ids and returns int32 ids inside one kernel) used by a trainer
while replay is on, so replay is silently skipped and recording sees nothing.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import rr_npu
from rr_core import ReplayController, ReplayMode
from rr_fakes import build_tiny_moe, emulated_torch_npu
from rr_npu._gating import (
    GatingGuard,
    gating_guard_installed,
    install_gating_guard,
    uninstall_gating_guard,
    unwatch,
)
from rr_npu_testing import in_fresh_process


@in_fresh_process
def test_guard_refuses_fused_gating_while_replay_is_on() -> None:
    model = build_tiny_moe(num_layers=2, num_experts=8, top_k=2)
    controller = ReplayController(num_experts=8, top_k=2)
    controller.attach(model)
    with emulated_torch_npu() as npu:
        copier = types.ModuleType("rr_npu_test_copier")  # `from torch_npu import op` copy
        copier.npu_moe_gating_top_k = npu.module.npu_moe_gating_top_k  # type: ignore[attr-defined]
        sys.modules[copier.__name__] = copier
        try:
            assert install_gating_guard()
            assert gating_guard_installed()
            assert isinstance(copier.npu_moe_gating_top_k, GatingGuard)  # type: ignore[attr-defined]
            rr_npu.watch(controller)
            x = torch.randn(4, 8)
            _w, ids, _s = npu.module.npu_moe_gating_top_k(x, 2)  # OFF: inference path works
            assert ids.dtype == torch.int32
            for mode in (ReplayMode.RECORD, ReplayMode.REPLAY):
                controller.set_mode(mode)
                with pytest.raises(rr_npu.FusedGatingError, match=r"layers \[1, 2\]"):
                    npu.module.npu_moe_gating_top_k(x, 2)
                with pytest.raises(rr_npu.FusedGatingError):
                    copier.npu_moe_gating_top_k(x, 2)  # type: ignore[attr-defined]
            assert len(npu.gating_calls) == 1  # the refused calls never reached the op
            controller.set_mode(ReplayMode.OFF)
            npu.module.npu_moe_gating_top_k(x, 2)
        finally:
            unwatch(controller)
            controller.detach()
            assert uninstall_gating_guard() == 1
            sys.modules.pop(copier.__name__)
        assert not isinstance(npu.module.npu_moe_gating_top_k, GatingGuard)
        assert not isinstance(copier.npu_moe_gating_top_k, GatingGuard)  # type: ignore[attr-defined]


def test_the_public_guard_functions_of_earlier_releases_warn_and_still_work() -> None:
    with pytest.warns(DeprecationWarning, match=r"rr_npu.install\(\) installs"):
        assert rr_npu.install_gating_guard() is False  # no torch_npu loaded here
    with pytest.warns(DeprecationWarning, match=r"rr_npu.uninstall\(\) takes"):
        assert rr_npu.uninstall_gating_guard() == 0


def test_guard_is_a_no_op_without_torch_npu() -> None:
    assert "torch_npu" not in sys.modules
    assert install_gating_guard() is False
    assert uninstall_gating_guard() == 0
