"""Which CPU kernels run: numba-compiled ones where numba imports (optional:
``pip install rr-core[numba]``; vLLM itself pins numba, so an rr-vllm user has it), numpy
otherwise. Each compiled kernel has a numpy (or torch) twin that gives the same result bit for
bit (the replay pass: but the order of tied scores in a native row, which torch leaves open).

``RR_KERNEL=numpy`` (or :func:`use_kernel` in tests and benchmarks) picks numpy where numba is
installed. The kernels: the id checks of byte rows, also arming's check through its row index
and mask (:mod:`rr_core.routes.idcheck_numba`), the set codec's ranking and packing of top-8
byte rows (:mod:`rr_core.codecs.sets_numba`), the decoders of the ``set`` and ``packed``
payloads straight into the caller's layout (:mod:`rr_core.codecs.decode_numba`), and a
replaying router call's ids and agreement counts (:mod:`rr_core.replay.replay_numba`,
:mod:`rr_core.replay.agreement_numba`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

#: Empty arrays the compiled kernels read as "none" (no mask, no row index, no per-row output,
#: every slot): one typed argument in place of an optional one, so each kernel compiles once.
EMPTY_BOOL = np.zeros(0, dtype=np.bool_)
EMPTY_INT64 = np.zeros(0, dtype=np.int64)

#: The kernels that can run; ``None`` (the default): numba where it imports.
KERNELS = ("numba", "numpy")
_CHOSEN: list[str | None] = [os.environ.get("RR_KERNEL") or None]
_NUMBA: list[Any] = []  # [module] once imported, [None] if it does not import


def numba_module() -> Any:
    """The numba module, or None where it does not import (imported once, on first use)."""
    if not _NUMBA:
        try:
            _NUMBA.append(importlib.import_module("numba"))
        except Exception:  # not installed, or built against another numpy (ImportError, ...)
            _NUMBA.append(None)
    return _NUMBA[0]


def numba_available() -> bool:
    """Whether numba imports here."""
    return numba_module() is not None


def kernel() -> str:
    """The kernel family that runs now: ``"numba"`` or ``"numpy"``."""
    chosen = _CHOSEN[0]
    if chosen is None:
        return "numba" if numba_available() else "numpy"
    if chosen not in KERNELS:
        raise ValueError(f"RR_KERNEL must be one of {KERNELS}; got {chosen!r}")
    if chosen == "numba" and not numba_available():
        raise ImportError("the numba kernels need numba: pip install 'rr-core[numba]'")
    return chosen


@contextmanager
def use_kernel(name: str | None) -> Iterator[None]:
    """Run kernel family ``name`` (one of :data:`KERNELS`, or None for the default) inside the
    block."""
    before = _CHOSEN[0]
    _CHOSEN[0] = name
    try:
        kernel()
        yield
    finally:
        _CHOSEN[0] = before


def compile_kernel(function: Any) -> Any:
    """``numba.njit`` without the GIL or bounds checks, cached on disk where it can be."""
    numba = numba_module()
    options = {"nogil": True, "boundscheck": False}
    try:
        return numba.njit(cache=True, **options)(function)
    except RuntimeError:  # no writable cache location: compile each process
        return numba.njit(**options)(function)
