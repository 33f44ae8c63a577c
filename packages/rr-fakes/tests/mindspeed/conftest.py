"""The ``stub`` fixture of the emulated MindSpeed's tests."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from stub_targets import STUB, STUB_SOURCE, stub_module


@pytest.fixture
def stub() -> Iterator[types.ModuleType]:
    """A throw-away module standing in for Megatron's router, moe_utils and moe_layer, a module
    holding ``from`` copies, and one whose name contains ``mindspeed``."""
    module = stub_module(STUB, STUB_SOURCE)
    for name in ("rr_fakes_stub_copier", "rr_fakes_stub_mindspeed_copier"):
        holder = stub_module(name)
        holder.topk_softmax_with_capacity = module.topk_softmax_with_capacity
        holder.TopKRouter = module.TopKRouter
    yield module
    for name in (STUB, "rr_fakes_stub_copier", "rr_fakes_stub_mindspeed_copier"):
        sys.modules.pop(name, None)
