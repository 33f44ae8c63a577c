"""Compat tests run against a real megatron-core (one nox session per line); without one every
test that needs it is skipped with the reason. A test that leaves rr's hooks installed or
routers attached fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rr_fakes.pytest_support import skip_folder
from rr_fakes.shims.megatron import unavailable_reason

HERE = Path(__file__).parent
#: Tests that run without megatron-core (version flags, lazy imports, the doctor view).
NO_MEGATRON_NEEDED = ("test_compat_install.py::test_nomegatron_",)


REASON = unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_folder(items, HERE, REASON, keep=NO_MEGATRON_NEEDED)


@pytest.fixture
def megatron() -> Iterator[None]:
    """One model-parallel process group with rr's Megatron hooks installed, for one test."""
    import rr_megatron_compat as rmc
    from compat_megatron_steps import patched

    with patched(rmc.install, rmc.uninstall):
        yield
