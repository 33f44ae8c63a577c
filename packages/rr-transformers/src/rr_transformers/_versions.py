"""The installed transformers release, checked once against the supported range: refused below
the floor or when known to break, warned about (once) when newer than the newest tested line."""

from __future__ import annotations

import functools
import importlib.util
import warnings
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rr_core import RRWarning
from rr_transformers._errors import TransformersVersionError
from rr_transformers._supported import (
    KNOWN_BROKEN,
    ROUTE_IN_BLOCK,
    SUPPORTED,
    TESTED_RELEASES,
)

#: The newest release rr-transformers is tested on.
NEWEST_TESTED = Version(TESTED_RELEASES[-1])


class UntestedTransformersWarning(RRWarning):
    """transformers is newer than the newest tested release: rr proves its hooks at attach."""


def installed_transformers_version() -> Version | None:
    """The installed release (from package metadata; transformers is not imported), or None.
    A version that names no release ('main', 'unknown') is refused by name, and so is a
    transformers importable without metadata (a source checkout on ``sys.path``)."""
    try:
        text = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        spec = importlib.util.find_spec("transformers")
        if spec is None:
            return None
        raise TransformersVersionError(
            f"transformers imports from {spec.origin} but is not installed (no package "
            "metadata, so its release is unknown): a source checkout on sys.path, such as the "
            "working directory? Install it (pip install -e <checkout>) or run elsewhere"
        ) from None
    try:
        return Version(text)
    except InvalidVersion:
        raise TransformersVersionError(
            f"transformers reports its version as {text!r}, which names no release, so rr "
            "cannot tell which router code it runs. Install a release (tested: "
            f"{', '.join(TESTED_RELEASES)})"
        ) from None


def newer_than_tested(version: Version) -> bool:
    """Whether ``version`` is past the newest tested line (a patch release of it is not)."""
    return version.release[:2] > NEWEST_TESTED.release[:2]


def check_transformers_version(version: Version | None) -> Version:
    """``version`` if rr replays on it, else :class:`TransformersVersionError` naming it: below
    the floor, or a release known to break. A release newer than the newest tested one is
    accepted (the caller warns; ``attach`` proves the hooks)."""
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
            "module to route through). Install transformers 5.0 or newer"
        )
    for releases, why in KNOWN_BROKEN.items():
        if SpecifierSet(releases).contains(version, prereleases=True):
            raise TransformersVersionError(
                f"transformers {version} is known to break routing replay ({releases}): {why}. "
                f"Install another release (tested: {', '.join(TESTED_RELEASES)})"
            )
    return version


def warn_if_untested(version: Version) -> None:
    """An :class:`UntestedTransformersWarning` when ``version`` is newer than every test line."""
    if newer_than_tested(version):
        warnings.warn(
            f"transformers {version} is newer than the newest release rr-transformers is tested "
            f"on ({NEWEST_TESTED}); attach proves the router hooks on each model (a probe through "
            "every router) and raises naming the layer where one does not take",
            UntestedTransformersWarning,
            stacklevel=3,
        )


@functools.cache
def checked_version() -> Version:
    """The installed release, checked once (:func:`check_transformers_version`); warns once
    when it is newer than the tested lines."""
    version = check_transformers_version(installed_transformers_version())
    warn_if_untested(version)
    return version


def routes_in_block(version: Version) -> bool:
    """Whether the grouped families select in the MoE block (before 5.13) or the router."""
    return SpecifierSet(ROUTE_IN_BLOCK).contains(version, prereleases=True)
