"""Helpers of the rr-npu tests (a unique module name, so test runs across packages cannot pick up
another package's conftest)."""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

FRESH = "RR_NPU_FRESH_PROCESS"


def in_fresh_process(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` in a fresh interpreter: the torch_npu emulation renames PrivateUse1 to
    "npu" for the rest of its process, and torch.compile (used by megatron-core 0.16+) then
    fails on a device name without a ``torch.npu`` module."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        if os.environ.get(FRESH) == test.__name__:
            test(*args, **kwargs)
            return
        node = f"{inspect.getfile(test)}::{test.__name__}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, FRESH: test.__name__},
            check=False,
        )
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]

    return wrapper
