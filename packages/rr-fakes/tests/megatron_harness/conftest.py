"""Harness tests need a megatron-core install; without one every test here is skipped."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from rr_fakes.megatron import megatron_cpu

HERE = Path(__file__).parent


def _unavailable() -> str | None:
    """Why megatron.core cannot be used here, or None. The import runs inside the harness:
    0.18+ cannot import megatron.core without triton."""
    try:
        with megatron_cpu():
            importlib.import_module("megatron.core")
    except ImportError as error:
        return f"megatron-core unavailable: {error}"
    return None


REASON = _unavailable()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REASON is None:
        return
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=REASON))
