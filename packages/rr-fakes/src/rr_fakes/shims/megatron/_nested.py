"""Context managers over :func:`megatron_cpu` whose nested entries share the outermost one."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from rr_fakes.shims.megatron._shims import megatron_cpu


def outermost_under_megatron_cpu(
    body: Callable[[], Iterator[None]],
) -> Callable[[], AbstractContextManager[None]]:
    """A context manager that enters :func:`megatron_cpu` and then ``body`` (a generator
    function: set up, yield once, tear down), except where it is already entered: a nested
    entry runs only ``megatron_cpu`` and shares the outer one's set-up."""
    depth = 0
    enter = contextlib.contextmanager(body)

    @contextlib.contextmanager
    @functools.wraps(body)
    def entered() -> Iterator[None]:
        nonlocal depth
        with megatron_cpu():
            if depth:
                depth += 1
                try:
                    yield
                finally:
                    depth -= 1
                return
            with enter():
                depth += 1
                try:
                    yield
                finally:
                    depth -= 1

    return entered
