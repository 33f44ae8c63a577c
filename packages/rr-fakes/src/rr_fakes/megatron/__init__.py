"""Deprecated aliases only: the old paths of :mod:`rr_fakes.hf_to_megatron`'s names
(``rr_fakes.megatron.hf_loader``, ``rr_fakes.megatron.bridge_hf``), kept for one release with a
``DeprecationWarning`` naming the new path. The CPU harness that lived here is
:mod:`rr_fakes.shims.megatron` (moved without an alias: rr-fakes' module paths are the test
harness's, not an API)."""

from __future__ import annotations

import warnings
from typing import Any

NEW_PATH = "rr_fakes.hf_to_megatron"


def moved_attr(old_module: str, name: str, names: tuple[str, ...]) -> Any:
    """``name`` of ``old_module`` answered from :mod:`rr_fakes.hf_to_megatron` with a
    ``DeprecationWarning`` naming the new path, when ``name`` is one of the moved ``names``."""
    if name not in names:
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
    warnings.warn(
        f"{old_module}.{name} moved to {NEW_PATH}.{name}; import it from {NEW_PATH} "
        f"(the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )
    import rr_fakes.hf_to_megatron as new

    return getattr(new, name)


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"rr_fakes.megatron.{name}: the CPU harness moved to rr_fakes.shims.megatron "
        f"(no alias); the Hugging Face conversion is rr_fakes.hf_to_megatron"
    )
