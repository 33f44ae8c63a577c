from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from rr_core import ReplayController

from rr_core_testing import E, K


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """Set ``torch.set_num_threads`` (which rr_core's row loops follow) for one test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def controller() -> Iterator[ReplayController]:
    """A controller of the tiny test model's E experts and top-K, detached after the test."""
    ctrl = ReplayController(num_experts=E, top_k=K)
    yield ctrl
    ctrl.detach()
