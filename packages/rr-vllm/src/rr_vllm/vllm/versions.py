"""SGLang version flags, computed once from :data:`rr_vllm._supported.SGLANG_FEATURES`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet

from rr_core.features import feature_flags
from rr_vllm._supported import SGLANG_FEATURES, SGLANG_SUPPORTED
from rr_vllm.errors import CaptureError
from rr_vllm.vllm.versions import _release

_SGLANG = ("SGLang", "0.5.23")  # how a version error names the engine


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
        return _release(self.version, *_SGLANG) in SpecifierSet(SGLANG_SUPPORTED)


def sglang_flags(version: str) -> SglangFlags:
    """The flags of one SGLang version string such as ``'0.5.23'`` (cached per version); one
    before capture (0.5.7) raises :class:`CaptureError`."""
    _release(version, *_SGLANG)
    flags = _sglang_flags(version)
    if not flags.capture:
        raise CaptureError(
            f"SGLang {version} cannot return routed experts: return_routed_experts arrived in "
            f"0.5.7; upgrade to sglang{SGLANG_SUPPORTED}"
        )
    return flags


@functools.cache
def _sglang_flags(version: str) -> SglangFlags:
    release = _release(version, *_SGLANG)
    return feature_flags(SglangFlags, SGLANG_FEATURES, release, version=version)
