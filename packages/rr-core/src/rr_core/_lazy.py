"""Lazy public names (PEP 562) for rr packages: importing a package, or reading its
supported-version table, must not import torch (``rr doctor`` answers where torch fails)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str], eager: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each name in ``names`` is imported from
    its module on first access and cached in the package namespace."""
    namespace = importlib.import_module(package).__dict__
    public = sorted({*names, *eager})

    def module_getattr(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def module_dir() -> list[str]:
        return public

    return module_getattr, module_dir
