"""The Megatron demo needs a megatron-core install; without one its tests are skipped (the
transformers demo's tests run in the transformers sessions, the training loop's in the trl
session, where megatron is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rr_fakes.pytest_support import skip_folder
from rr_fakes.shims.megatron import unavailable_reason

HERE = Path(__file__).parent
REASON = unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_folder(items, HERE, REASON, keep=("test_demo_transformers.py", "test_demo_loop.py"))
