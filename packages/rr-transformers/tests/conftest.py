"""Shared fixtures: no leaked attachments, and rr's hooks removed after every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import rr_transformers


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread per test process: xdist already runs a process per core, and tiny
    models lose more to thread hand-offs than they gain."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def hooks() -> Iterator[None]:
    rr_transformers.install()
    yield
    rr_transformers.uninstall()
