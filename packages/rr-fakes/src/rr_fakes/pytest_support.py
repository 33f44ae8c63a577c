"""The pieces every package's ``conftest.py`` shares: a fixture that fails a test leaving
routers attached, and skipping a folder's tests when what they need is not installed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

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


def skip_folder(
    items: Iterable[pytest.Item], folder: Path, reason: str | None, keep: tuple[str, ...] = ()
) -> None:
    """Mark every collected test under ``folder`` skipped with ``reason`` (nothing when it is
    None), except the node ids containing one of ``keep``."""
    if reason is None:
        return
    for item in items:
        if folder in item.path.parents and not any(k in item.nodeid for k in keep):
            item.add_marker(pytest.mark.skip(reason=reason))
