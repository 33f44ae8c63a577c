"""Names that moved to another module keep working from the old one for one release, with a
:class:`DeprecationWarning` that names the new home."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def moved_names(old: str, new_home: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old`` that serves each name of ``new_home`` from the
    module it maps to. The import happens on first use, so the old module imports nothing of
    the new one (no import arrow runs back up)."""

    def served(name: str) -> object:
        home = new_home.get(name)
        if home is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {home}.{name}; import it from there ({old} stops serving "
            "it in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return served
