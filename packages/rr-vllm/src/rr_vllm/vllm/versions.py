"""Deprecated: vLLM's version flags live in :mod:`rr_vllm.releases` (shared by both engines and
the engine configuration check); the public names stay ``rr_vllm.vllm_flags`` and friends. This
module keeps the old import path working for one release."""

from __future__ import annotations

import warnings
from typing import Any

from rr_vllm import releases

_MOVED = {
    "VllmFlags": "VllmFlags",
    "installed_vllm_version": "installed_vllm_version",
    "vllm_flags": "vllm_flags",
    "resolve_flags": "resolve_flags",
    "_release": "release_of",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = _MOVED[name]
    warnings.warn(
        f"rr_vllm.vllm.versions.{name} moved to rr_vllm.releases.{new}; the old path goes in "
        "the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(releases, new)
