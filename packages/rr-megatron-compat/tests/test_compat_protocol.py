"""rr_megatron_compat's adapter under the protocol of :mod:`rr_core.adapters` (the contract in
:mod:`rr_fakes.adapter_protocol`), on each megatron-core line's real TopKRouter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rr_megatron_compat as rmc
from rr_fakes.adapter_protocol import AdapterContract, ProtocolCase


class TestMegatronAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, model_parallel

        with model_parallel():
            try:
                yield ProtocolCase(
                    rmc.ADAPTER, lambda: build_gpt(TinyGPTConfig(extra=rmc.replay_config_fields()))
                )
            finally:
                rmc.uninstall()
