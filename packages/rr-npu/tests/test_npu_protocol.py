"""rr_npu's adapter under the protocol of :mod:`rr_core.adapters` (the contract in
:mod:`rr_fakes.adapter_protocol`), over a real megatron-core (no MindSpeed loaded: rr_npu then
hooks through rr_megatron_compat)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

import rr_megatron_compat as rmc
import rr_npu
from rr_fakes.adapter_protocol import AdapterContract, ProtocolCase, megatron_case

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None,
    reason="needs megatron-core (the megatron sessions of the lines MindSpeed users run)",
)


class TestMindSpeedAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        with megatron_case(rr_npu.ADAPTER, rmc.replay_config_fields()) as case:
            yield case
