"""Version flags of the installed megatron-core, computed once, from package metadata only
(importing megatron.core itself needs triton on 0.18+, which is one of the things the harness
provides)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass

from packaging.version import Version

from rr_fakes.megatron._lines import MEGATRON_RANGE


class MegatronNotInstalledError(ImportError):
    """megatron-core is not installed; the CPU harness needs it."""


@dataclass(frozen=True)
class MegatronFlags:
    """What differs between the megatron-core lines, as far as the CPU harness is concerned."""

    version: Version
    #: moe_utils names ``te_general_gemm`` only when Transformer Engine imports (0.13 - 0.16),
    #: so the router's gating raises NameError without TE.
    needs_te_gemm_name: bool
    #: megatron.core.transformer.moe.ops.paged_stash imports triton unconditionally (0.18+).
    needs_triton: bool
    #: TopKRouter's process-group argument: none (0.12), ``model_comm_pgs`` (0.13 - 0.14),
    #: ``pg_collection`` (0.15+). Omitting it fails on 0.13+ although the signature allows it.
    router_pg_kwarg: str | None
    #: Layer specs, GPTModel and the stage predicates take ``vp_stage`` (0.13+); 0.12 reads the
    #: virtual pipeline rank from global state.
    vp_stage_kwarg: bool
    #: Routers of MTP layers carry ``is_mtp_layer`` (0.17+).
    router_has_is_mtp_layer: bool
    #: ``moe_enable_routing_replay`` / RouterReplay exist (0.16+).
    native_routing_replay: bool

    @property
    def line(self) -> str:
        return f"{self.version.major}.{self.version.minor}"


def megatron_version() -> Version:
    try:
        return Version(importlib.metadata.version("megatron-core"))
    except importlib.metadata.PackageNotFoundError as error:
        raise MegatronNotInstalledError(
            "megatron-core is not installed; install a supported line "
            f"(megatron-core{MEGATRON_RANGE}) next to torch to use rr_fakes.megatron"
        ) from error


@functools.cache
def megatron_flags() -> MegatronFlags:
    """The flags of the installed megatron-core (cached: the install does not change under a
    running process)."""
    v = Version(megatron_version().base_version)
    if not Version("0.12") <= v < Version("0.20"):
        raise MegatronNotInstalledError(
            f"megatron-core {v} is outside the range the CPU harness supports ({MEGATRON_RANGE})"
        )
    if v >= Version("0.15"):
        pg_kwarg: str | None = "pg_collection"
    elif v >= Version("0.13"):
        pg_kwarg = "model_comm_pgs"
    else:
        pg_kwarg = None
    return MegatronFlags(
        version=v,
        needs_te_gemm_name=Version("0.13") <= v < Version("0.17"),
        needs_triton=v >= Version("0.18") and importlib.util.find_spec("triton") is None,
        router_pg_kwarg=pg_kwarg,
        vp_stage_kwarg=v >= Version("0.13"),
        router_has_is_mtp_layer=v >= Version("0.17"),
        native_routing_replay=v >= Version("0.16"),
    )
