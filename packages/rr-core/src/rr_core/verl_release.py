"""The verl releases rr hooks, stated once for every verl side (the Megatron engine in
rr-megatron-compat, the FSDP engine in rr-transformers, the rollout in rr-vllm), and the one
check each side runs before it patches verl.

Reads package metadata only: no verl module is imported. Each way the release can be missing or
unreadable gets its own error, naming the cause: verl not installed, a ``verl/`` source tree
on ``sys.path`` that is not an installed distribution (a checkout in the working directory),
and a version string that is no release (``main``, ``unknown``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rr_core.errors import ReplayError

#: The verl line rr's verl sides are tested on (``install(force=True)`` hooks another one).
VERL_SPECIFIER = ">=0.9.1,<0.10"


class VerlReleaseError(ReplayError):
    """verl's release is missing, unreadable, or outside :data:`VERL_SPECIFIER` (replay on an
    untested verl cannot be promised exact)."""


def verl_release(caller: str) -> Version | str:
    """The installed verl's release, or its version string where that is no release.

    ``caller`` names the entry that asked (``rr_megatron_compat.verl.install()``) in the
    errors."""
    try:
        text = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        raise VerlReleaseError(_missing(caller)) from None
    try:
        return Version(text)
    except InvalidVersion:
        return text


def check_verl_release(caller: str, *, force: bool = False) -> Version | None:
    """The installed verl's release after checking it against :data:`VERL_SPECIFIER`; with
    ``force`` any installed verl passes (None where its version is no release)."""
    release = verl_release(caller)
    if isinstance(release, str):
        if force:
            return None
        raise VerlReleaseError(
            f"{caller}: the installed verl's version reads {release!r}, which is no release, so "
            f"rr cannot tell whether it is in the tested range {VERL_SPECIFIER}; install a verl "
            "release, or pass force=True to hook this one anyway"
        )
    if not force and release not in SpecifierSet(VERL_SPECIFIER):
        raise VerlReleaseError(
            f"{caller}: verl {release} is outside the tested range {VERL_SPECIFIER}; "
            "install(force=True) hooks it anyway"
        )
    return release


def _missing(caller: str) -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None:
        return f"{caller} hooks verl, and verl is not installed (pip install verl==0.9.1 --no-deps)"
    where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "sys.path"
    return (
        f"{caller}: 'import verl' finds {where}, which is no installed verl distribution (a verl "
        "source tree on sys.path, e.g. a verl/ checkout in the working directory); rr reads the "
        "installed release to check it: install that tree (pip install -e <it> --no-deps) or "
        "run from a directory without it"
    )
