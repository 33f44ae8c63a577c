"""verl harness tests need megatron-core and verl's engine importable; without them every test
here is skipped with the reason. Each test must leave Megatron's router classes as verl's
router replay patch found them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rr_fakes.pytest_support import skip_folder
from rr_fakes.shims.megatron import unavailable_reason as megatron_reason
from rr_fakes.shims.verl import unavailable_reason as verl_reason

HERE = Path(__file__).parent

REASON = megatron_reason() or verl_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_folder(items, HERE, REASON)


@pytest.fixture(autouse=True)
def _no_leaked_replay_patch() -> Iterator[None]:
    """Fail a test that leaves verl's router replay patch on Megatron's TopKRouter: it replaces
    routing for every router built later in the process."""
    if REASON is not None:
        yield
        return
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.router_replay import RouterReplay

    before = (vars(TopKRouter)["routing"], vars(TopKRouter)["__init__"])
    native = len(RouterReplay.global_router_replay_instances)
    yield
    assert len(RouterReplay.global_router_replay_instances) == native, "leaked native replays"
    after = (vars(TopKRouter)["routing"], vars(TopKRouter)["__init__"])
    assert after == before, "a test left verl's router replay patch on TopKRouter"
    assert "_router_replay_patched" not in vars(TopKRouter)
