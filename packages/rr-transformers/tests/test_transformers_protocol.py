"""rr_transformers' adapter under the protocol of :mod:`rr_core.adapters` (the contract in
:mod:`rr_fakes.adapter_protocol`), on a real transformers Qwen3-MoE model. ``attach`` before
``install()`` still installs for one release, with a DeprecationWarning."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rr_transformers
from rr_fakes.adapter_protocol import AdapterContract, ProtocolCase
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_model


class TestTransformersAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        try:
            yield ProtocolCase(
                rr_transformers.ADAPTER,
                lambda: tiny_model("qwen3_moe"),
                num_experts=NUM_EXPERTS,
                top_k=TOP_K,
                attach_before_install="deprecated",
            )
        finally:
            rr_transformers.uninstall()
