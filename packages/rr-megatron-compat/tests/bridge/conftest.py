"""The bridge tests build real Megatron-Bridge models (the ``bridge`` nox session installs
megatron-bridge next to megatron-core 0.19); without megatron.bridge every test here is skipped
with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rr_fakes.pytest_support import skip_folder
from rr_fakes.shims.megatron.bridge_shims import unavailable_reason

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_folder(items, HERE, unavailable_reason())


@pytest.fixture
def bridge() -> Iterator[None]:
    """Megatron's parallel state and bridge's CPU shims, for one test; Megatron's global
    RouterReplay list as it was on entry afterwards (each build appends to it)."""
    from rr_fakes.shims.megatron import model_parallel
    from rr_fakes.shims.megatron.bridge_shims import bridge_cpu

    with model_parallel(), bridge_cpu():
        from megatron.core.transformer.moe.router_replay import RouterReplay

        instances = RouterReplay.global_router_replay_instances
        before = list(instances)
        try:
            yield
        finally:
            instances[:] = before
