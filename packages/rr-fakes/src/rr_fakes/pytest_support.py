"""The pieces every package's tests share: the one leak check (a fixture that fails a test
leaving routers attached or an adapter's patches in place), and skipping a folder's tests when
what they need is not installed.

This module is a pytest plugin (the ``pytest11`` entry point ``rr-leak-check``): wherever
rr-fakes is installed, every test pytest runs gets the leak check, in folders without a
``conftest.py`` too; ``-p no:rr-leak-check`` turns it off."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rr_core.adapters import Installer, adapters, leaked_patches
from rr_core.replay.controller import attached_router_count

#: A bad call of a public function: (test id, the call, the error it raises, a fragment of
#: that error's message).
BadCall = tuple[str, Callable[[], object], type[Exception], str]


def over_bad_calls(cases: Iterable[BadCall]) -> pytest.MarkDecorator:
    """Parametrize a test's ``call``, ``error`` and ``fragment`` over ``cases``, by their ids."""
    return pytest.mark.parametrize(
        ("call", "error", "fragment"), [pytest.param(c, e, f, id=name) for name, c, e, f in cases]
    )


def raised_by(call: Callable[[], object], error: type[Exception], fragment: str) -> Exception:
    """What ``call()`` raises, checked to be an ``error`` whose message holds ``fragment``."""
    with pytest.raises(error, match=re.escape(fragment)) as info:
        call()
    return info.value


@pytest.fixture(autouse=True)
def _no_leaked_attachments() -> Iterator[None]:
    """Fail a test that leaves routers attached to a controller or an rr adapter's patches in
    place (its hooks, guards, wrappers): under xdist one worker runs many tests, and a leaked
    attachment or hook would change what later tests observe. A leaked patch is taken out
    before the test fails, so the next test starts clean."""
    before = attached_router_count()
    yield
    leaked = attached_router_count() - before
    patches = leaked_patches()
    for name in patches:
        installer = adapters()[name]
        if isinstance(installer, Installer):  # (leaked_patches names installers only)
            installer.uninstall()
    assert not patches, f"test left rr's patches in place: {patches}; call uninstall()"
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


def settles(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """For property sweeps: ``(True, result)``, or ``(False, message)`` when ``fn`` raises an
    RRError; any other exception propagates, failing the example."""
    from hypothesis import event

    from rr_core import RRError

    name = getattr(fn, "__qualname__", repr(fn))
    try:
        result = fn(*args, **kwargs)
    except RRError as e:
        event(f"{name}: {type(e).__name__}")  # --hypothesis-show-statistics counts outcomes
        message = str(e)
        assert message, "an RRError without a message"
        return False, message
    event(f"{name}: a result")
    return True, result
