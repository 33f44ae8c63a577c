"""Version flags of the installed megatron-core for the CPU harness, computed once from package
metadata only (importing megatron.core itself needs triton on 0.18+, which is one of the things
the harness provides). The facts are ``HARNESS_FEATURES`` in :mod:`rr_fakes.pins`."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass, replace

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rr_core.features import feature_flags
from rr_fakes.pins import HARNESS_FEATURES
from rr_fakes.shims.megatron._lines import MEGATRON_RANGE


class MegatronNotInstalledError(ImportError):
    """megatron-core is not installed; the CPU harness needs it."""


@dataclass(frozen=True)
class MegatronFlags:
    """What differs between the megatron-core lines for the CPU harness (one field per
    ``HARNESS_FEATURES`` key)."""

    version: Version
    #: moe_utils names ``te_general_gemm`` only when Transformer Engine imports, so the
    #: router's gating raises NameError without TE.
    needs_te_gemm_name: bool
    #: megatron.core imports triton unconditionally and triton is not installed here.
    needs_triton: bool
    #: Layer specs, GPTModel and the stage predicates take ``vp_stage``.
    vp_stage_kwarg: bool
    #: Routers of MTP layers carry ``is_mtp_layer``.
    router_has_is_mtp_layer: bool

    @property
    def line(self) -> str:
        return f"{self.version.major}.{self.version.minor}"


def megatron_version() -> Version:
    try:
        return Version(importlib.metadata.version("megatron-core"))
    except importlib.metadata.PackageNotFoundError as error:
        raise MegatronNotInstalledError(
            "megatron-core is not installed; install a supported line "
            f"(megatron-core{MEGATRON_RANGE}) next to torch to use rr_fakes.shims.megatron"
        ) from error


@functools.cache
def megatron_flags() -> MegatronFlags:
    """The flags of the installed megatron-core (cached: the install does not change under a
    running process)."""
    v = Version(megatron_version().base_version)
    if v not in SpecifierSet(MEGATRON_RANGE):
        raise MegatronNotInstalledError(
            f"megatron-core {v} is outside the range the CPU harness supports ({MEGATRON_RANGE})"
        )
    flags = feature_flags(MegatronFlags, HARNESS_FEATURES, v, version=v)
    triton = flags.needs_triton and importlib.util.find_spec("triton") is None
    return replace(flags, needs_triton=triton)
