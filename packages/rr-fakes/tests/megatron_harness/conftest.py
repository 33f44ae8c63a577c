"""Harness tests need a megatron-core install; without one every test here is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from rr_fakes.pytest_support import skip_folder
from rr_fakes.shims.megatron import unavailable_reason

HERE = Path(__file__).parent


REASON = unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_folder(items, HERE, REASON)
