from __future__ import annotations

from collections.abc import Iterator

import pytest

from rr_core.replay.controller import attached_router_count


@pytest.fixture(autouse=True)
def _no_leaked_attachments() -> Iterator[None]:
    """Fail a test that leaves routers attached to a controller: under xdist one worker runs
    many tests, and a leaked attachment would make later routers replay."""
    before = attached_router_count()
    yield
    leaked = attached_router_count() - before
    assert leaked <= 0, f"test left {leaked} routers attached; call controller.detach()"
