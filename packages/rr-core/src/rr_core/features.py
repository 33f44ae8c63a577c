"""Version features as flags, one rule for every adapter.

Each adapter declares the features of its dependency once, as data (``name -> version
specifier``, in its ``_supported.py``), and a frozen dataclass with one bool field per feature.
:func:`feature_flags` turns a version into that dataclass, and refuses a table and a class that
disagree (a feature added to the table without its flag, or a flag without its feature), so the
two cannot drift apart silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["feature_flags"]

F = TypeVar("F")


def feature_flags(
    flags: type[F], features: Mapping[str, str], release: Version, **fields: Any
) -> F:
    """``flags(**fields, name=release in spec ...)`` for every ``name: spec`` of ``features``.

    ``release`` is compared as given (pass its ``base_version`` to treat a pre, dev or post
    release as the release it belongs to).
    Raises TypeError naming the names when the dataclass's fields are not exactly the features
    plus ``fields``: that is a defect of the adapter, not of the user's input."""
    declared = {f.name for f in dataclasses.fields(flags)}  # type: ignore[arg-type]
    wanted = set(features) | set(fields)
    if declared != wanted:
        raise TypeError(
            f"{flags.__name__} has fields {sorted(declared)}; its feature table and the fields "
            f"given make {sorted(wanted)} (missing {sorted(wanted - declared)}, extra "
            f"{sorted(declared - wanted)})"
        )
    values = {name: release in SpecifierSet(spec) for name, spec in features.items()}
    return flags(**fields, **values)
