"""Deprecated: SGLang's version flags live in :mod:`rr_vllm.releases` (shared by both engines and
the engine configuration check); the public names stay ``rr_vllm.sglang_flags`` and
``rr_vllm.SglangFlags``. This module keeps the old import path working for one release."""

from __future__ import annotations

import warnings
from typing import Any

from rr_vllm import releases

_MOVED = frozenset({"SglangFlags", "sglang_flags"})


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"rr_vllm.sglang.versions.{name} moved to rr_vllm.releases.{name}; the old path goes in "
        "the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(releases, name)
