"""rr_megatron_compat's adapter under the protocol of :mod:`rr_core.adapters` (the contract in
:mod:`rr_fakes.adapter_protocol`), on each megatron-core line's real TopKRouter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rr_megatron_compat as rmc
from rr_fakes.adapter_protocol import AdapterContract, ProtocolCase, megatron_case


class TestMegatronAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        with megatron_case(rmc.ADAPTER, rmc.replay_config_fields()) as case:
            yield case
