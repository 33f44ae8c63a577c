"""rr-npu tests. The torch-only ones run anywhere; the ones that need a real megatron-core skip
with the reason where none is installed. A test that leaves rr's hooks, the gating guard or a
patch-manager wrapper installed fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_leaked_state() -> Iterator[None]:
    import rr_npu._gating as gating
    import rr_npu._install as install

    yield
    leaked = {
        "installed": install._STATE["installed"],
        "patch-manager hooks": len(install._HOOKED),
        "gating guards": len(gating._INSTALLED),
    }
    if any(leaked.values()):
        install.uninstall()
    assert not any(leaked.values()), f"test left rr_npu state behind: {leaked}"
