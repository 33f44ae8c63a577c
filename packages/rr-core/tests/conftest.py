from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from rr_fakes.pytest_support import _no_leaked_attachments

__all__ = ["_no_leaked_attachments"]  # an autouse fixture: importing it here applies it


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """Set ``torch.set_num_threads`` (which rr_core's row loops follow) for one test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
