"""rr_transformers.trl's installer under the install contract of :mod:`rr_core.adapters` (the
contract in :mod:`rr_fakes.adapter_protocol`), on the real TRL and vLLM classes it hooks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rr_transformers
import rr_transformers.trl
from rr_fakes.adapter_protocol import InstallerContract, ProtocolCase


class TestTrlInstaller(InstallerContract):
    @pytest.fixture
    def case(self) -> Iterator[ProtocolCase]:
        try:
            yield ProtocolCase(rr_transformers.trl.INSTALLER)
        finally:
            rr_transformers.trl.uninstall()
            rr_transformers.uninstall()
