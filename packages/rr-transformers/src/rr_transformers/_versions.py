"""The installed transformers release, checked once against the supported range."""

from __future__ import annotations

import functools
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rr_transformers._errors import TransformersVersionError
from rr_transformers._supported import ROUTE_IN_BLOCK, SUPPORTED


def installed_transformers_version() -> Version | None:
    """The installed release (from package metadata; transformers is not imported), or None."""
    try:
        return Version(metadata.version("transformers"))
    except metadata.PackageNotFoundError:
        return None


def check_transformers_version(version: Version | None) -> Version:
    """``version`` if rr supports it, else :class:`TransformersVersionError` naming it."""
    supported = SUPPORTED["transformers"]
    if version is None:
        raise TransformersVersionError(
            f"transformers is not installed; rr-transformers supports transformers{supported} "
            "(pip install 'rr-transformers[transformers]')"
        )
    if not SpecifierSet(supported).contains(version, prereleases=True):
        raise TransformersVersionError(
            f"transformers {version} is outside rr-transformers' supported range {supported}: "
            "4.x computes each family's top-k inline in the sparse block's forward (no router "
            "module to route through); newer releases are untested. Install a supported release"
        )
    return version


@functools.cache
def checked_version() -> Version:
    """The installed release, checked once (:func:`check_transformers_version`)."""
    return check_transformers_version(installed_transformers_version())


def routes_in_block(version: Version) -> bool:
    """Whether the grouped families select in the MoE block (before 5.13) or the router."""
    return SpecifierSet(ROUTE_IN_BLOCK).contains(version, prereleases=True)
