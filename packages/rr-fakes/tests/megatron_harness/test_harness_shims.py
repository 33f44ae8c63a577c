"""The CPU harness applies only what the installed line needs and restores everything on exit."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import sys

import pytest
import torch
import torch.distributed as dist
from packaging.version import Version

from rr_fakes import pins
from rr_fakes.shims.megatron import MEGATRON_LINES, MEGATRON_RANGE, megatron_cpu, megatron_flags
from rr_megatron_compat import SUPPORTED


def test_flags_describe_the_installed_line() -> None:
    flags = megatron_flags()
    installed = Version(importlib.metadata.version("megatron-core"))
    assert flags.version == Version(installed.base_version)
    assert flags.line in MEGATRON_LINES
    assert MEGATRON_LINES is pins.MEGATRON_LINES  # the pins' table, not a second one
    assert SUPPORTED["megatron-core"] == MEGATRON_RANGE
    assert {f.name for f in dataclasses.fields(flags)} - {"version"} == set(pins.HARNESS_FEATURES)


def cuda_surface() -> dict[str, object]:
    return {
        name: getattr(torch.cuda, name)
        for name in ("current_device", "synchronize", "Stream", "Event", "current_stream", "stream")
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shims apply only without CUDA")
def test_shims_apply_inside_and_are_undone_on_exit() -> None:
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    before = cuda_surface()
    tracker = random._CUDA_RNG_STATE_TRACKER
    all_to_all = dist.all_to_all_single
    with megatron_cpu() as flags:
        assert torch.cuda.current_device() == "cpu"
        assert torch.cuda.current_stream() == torch.cuda.Stream()
        assert torch.ones(2, device="cuda").device.type == "cpu"
        assert torch.zeros(1).cuda().device.type == "cpu"
        assert random._CUDA_RNG_STATE_TRACKER is not tracker
        assert dist.all_to_all_single is not all_to_all
        if flags.needs_triton:
            assert getattr(sys.modules["triton"], "__rr_fakes_stub__", False)
        with megatron_cpu():  # nested entries share the outer shims
            assert torch.cuda.current_device() == "cpu"
        assert torch.cuda.current_device() == "cpu"
    assert cuda_surface() == before
    assert random._CUDA_RNG_STATE_TRACKER is tracker
    assert dist.all_to_all_single is all_to_all
    assert "triton" not in sys.modules or not hasattr(sys.modules["triton"], "__rr_fakes_stub__")
    with pytest.raises((RuntimeError, AssertionError)):
        torch.ones(1, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shims apply only without CUDA")
def test_te_general_gemm_name_is_bound_only_where_megatron_leaves_it_unbound() -> None:
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    flags = megatron_flags()
    had_name = "te_general_gemm" in vars(moe_utils)
    with megatron_cpu():
        if flags.needs_te_gemm_name:
            assert moe_utils.te_general_gemm is None
    assert ("te_general_gemm" in vars(moe_utils)) == had_name


def test_rng_tracker_forks_the_cpu_generator() -> None:
    with megatron_cpu():
        random = importlib.import_module("megatron.core.tensor_parallel.random")
        tracker = random.get_cuda_rng_tracker()
        tracker.add("rr-test", 7)
        torch.manual_seed(0)
        with tracker.fork("rr-test"):
            first = torch.rand(3)
        outside = torch.rand(3)
        torch.manual_seed(7)
        assert torch.equal(first, torch.rand(3))
        torch.manual_seed(0)
        assert torch.equal(outside, torch.rand(3))
