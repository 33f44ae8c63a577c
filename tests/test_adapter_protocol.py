"""verl's adapters under the protocol of :mod:`rr_core.adapters` (the contract in
:mod:`rr_fakes.adapter_protocol`): the drop-in for verl's Megatron engine, the FSDP engine's and
the rollout side's (install only: it has no routers). Each other adapter runs the same contract
in its own package's session (``test_compat_protocol.py``, ``test_npu_protocol.py``,
``test_transformers_protocol.py``).

Runs where verl is installed with its engines' frameworks (the verl session)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator

import pytest

from rr_core.adapters import Installer
from rr_fakes.adapter_protocol import (
    AdapterContract,
    InstallerContract,
    ProtocolCase,
    megatron_case,
)


def _needs(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {missing} (the verl session)")


def _adapter(module: str) -> Installer:
    found = importlib.import_module(module).ADAPTER
    assert isinstance(found, Installer)
    return found


@_needs("verl", "megatron")
class TestVerlMegatronAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        import rr_megatron_compat as rmc

        with megatron_case(_adapter("rr_megatron_compat.verl"), rmc.replay_config_fields()) as c:
            yield c


@_needs("verl", "transformers")
class TestVerlFSDPAdapter(AdapterContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        import rr_transformers
        from rr_fakes.shims.hf_models import tiny_model

        adapter = _adapter("rr_transformers.verl")
        try:
            yield ProtocolCase(adapter, lambda: tiny_model("qwen3_moe"))
        finally:
            adapter.uninstall()
            rr_transformers.uninstall()  # the router hooks its install put in


@_needs("verl")
class TestVerlRolloutInstaller(InstallerContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        adapter = _adapter("rr_vllm.verl")
        try:
            yield ProtocolCase(adapter)
        finally:
            adapter.uninstall()
