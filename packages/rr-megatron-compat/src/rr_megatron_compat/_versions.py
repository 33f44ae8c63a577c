"""What differs between megatron-core lines, computed once from the installed version.

The facts are data in :mod:`rr_megatron_compat._supported` (``MEGATRON_FEATURES``); this module
turns them into :class:`MegatronLine` flags. Package metadata only: nothing here imports torch or
megatron (``rr megatron`` and ``rr doctor`` read these flags on machines where importing torch
fails). :func:`hook_specs` says which attributes ``install()`` wraps on a line; ``uninstall()``
undoes what ``install()`` recorded, whatever the line.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rr_core import RRError
from rr_core.features import feature_flags
from rr_megatron_compat._supported import MEGATRON_FEATURES, SUPPORTED

DISTRIBUTION = "megatron-core"
ROUTER = "megatron.core.transformer.moe.router"
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
ROUTER_REPLAY = "megatron.core.transformer.moe.router_replay"
DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"
LAYER = "megatron.core.transformer.transformer_layer"


class MegatronNotInstalledError(RRError, ImportError):
    """megatron-core is not installed (``pip install rr-megatron-compat[megatron]``)."""


class UnsupportedMegatronError(RRError, RuntimeError):
    """The installed megatron-core is outside the range rr supports."""


@dataclass(frozen=True)
class HookSpec:
    """One attribute :func:`rr_megatron_compat.install` wraps: ``module.owner.attribute`` (or
    ``module.attribute`` when ``owner`` is None), and what the wrapper does (``role``)."""

    module: str
    owner: str | None
    attribute: str
    role: str

    @property
    def name(self) -> str:
        return ".".join(p for p in (self.module, self.owner, self.attribute) if p)


@dataclass(frozen=True)
class MegatronLine:
    """Version flags of one megatron-core release (one per ``MEGATRON_FEATURES`` key)."""

    version: Version
    #: ``moe_enable_routing_replay`` and ``RouterReplay`` (0.16+): the native hook point.
    native_replay: bool
    #: ``topk_routing_with_score_function`` (0.14+); before that ``topk_softmax_with_capacity``.
    score_function_topk: bool
    #: ``TopKRouter.routing(logits, padding_mask=None)`` (0.16+).
    padding_mask: bool
    #: ``TopKRouter._apply_expert_bias`` masks ``routing_map`` [T, E] with ``~padding_mask`` [T]
    #: un-broadcast (G1, Megatron #6114: an error when T != E, wrong counts when T == E); rr
    #: counts in its place on these lines (0.16 - 0.19.2).
    expert_bias_padding_unbroadcast: bool
    #: ``TransformerLayer._maybe_unflatten_for_moe`` (0.19+): with
    #: ``PackedSeqParams.tokens_per_sample`` a packed batch routes as ``[S, mbs]`` rows.
    moe_unflatten_packed: bool

    @property
    def line(self) -> str:
        return f"{self.version.major}.{self.version.minor}"

    @property
    def supported(self) -> bool:
        return SpecifierSet(SUPPORTED[DISTRIBUTION]).contains(self.version, prereleases=True)


def line_flags(version: Version | str) -> MegatronLine:
    """The flags of ``version`` (pure: usable for any version string). A pre-release has the
    flags of the release it precedes."""
    if not isinstance(version, (Version, str)):
        raise UnsupportedMegatronError(
            f"line_flags takes a version string such as '0.16.0' or a packaging Version; got "
            f"{version!r} ({type(version).__name__})"
        )
    try:
        v = Version(Version(str(version)).base_version)
    except InvalidVersion as error:
        raise UnsupportedMegatronError(
            f"{version!r} is not a megatron-core version (expected e.g. '0.16.0')"
        ) from error
    return feature_flags(MegatronLine, MEGATRON_FEATURES, v, version=v)


def installed_version() -> Version | None:
    try:
        return Version(importlib.metadata.version(DISTRIBUTION))
    except importlib.metadata.PackageNotFoundError:
        return None


def import_megatron(module: str) -> Any:
    """A megatron-core module; one that does not import (megatron-core absent, or something it
    imports without declaring it, such as triton from 0.18) raises
    :class:`MegatronNotInstalledError` naming what failed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MegatronNotInstalledError(
            f"{module} does not import here ({type(e).__name__}: {e}); install a supported "
            f"megatron-core (megatron-core{SUPPORTED[DISTRIBUTION]}) and what it imports"
        ) from e


@functools.cache
def megatron_line() -> MegatronLine:
    """Flags of the installed megatron-core (cached: an install does not change under a running
    process). Raises :class:`MegatronNotInstalledError` when it is absent."""
    found = installed_version()
    if found is None:
        raise MegatronNotInstalledError(
            f"megatron-core is not installed; install a supported release "
            f"(megatron-core{SUPPORTED[DISTRIBUTION]}), e.g. "
            "`pip install rr-megatron-compat[megatron]`"
        )
    return line_flags(found)


def check_supported(line: MegatronLine, *, force: bool = False) -> None:
    """Raise :class:`UnsupportedMegatronError` naming the version when it is outside the range,
    unless ``force``."""
    if not force and not line.supported:
        raise UnsupportedMegatronError(
            f"megatron-core {line.version} is outside the range rr-megatron-compat supports "
            f"({DISTRIBUTION}{SUPPORTED[DISTRIBUTION]}); install a supported release, or pass "
            "force=True to patch it anyway (replay is then untested on this version)"
        )


def hook_specs(line: MegatronLine) -> tuple[HookSpec, ...]:
    """The attributes :func:`install` wraps on ``line``, in patch order.

    Every line: ``TopKRouter.routing`` marks which router is routing (and checks that the
    selection hook fired). The selection hook: ``RouterReplay.get_replay_topk`` (0.16+, the
    native hook, reached only where ``moe_enable_routing_replay`` is set on the config);
    before 0.16 the top-k function the router calls plus ``group_limited_topk``, through
    which that function is steered to the hook.
    """
    if not isinstance(line, MegatronLine):
        raise UnsupportedMegatronError(
            f"hook_specs takes a MegatronLine (megatron_line() or line_flags(version)); got "
            f"{line!r} ({type(line).__name__})"
        )
    specs = [HookSpec(ROUTER, "TopKRouter", "routing", "routing")]
    if line.native_replay:
        specs.append(HookSpec(ROUTER_REPLAY, "RouterReplay", "get_replay_topk", "native_select"))
    else:
        topk = (
            "topk_routing_with_score_function"
            if line.score_function_topk
            else ("topk_softmax_with_capacity")
        )
        specs.append(HookSpec(ROUTER, None, topk, "topk_function"))
        specs.append(HookSpec(MOE_UTILS, None, "group_limited_topk", "group_select"))
    specs.append(
        HookSpec(DISPATCHER, "MoEAlltoAllTokenDispatcher", "preprocess", "alltoall_preprocess")
    )
    if line.moe_unflatten_packed:
        specs.append(HookSpec(LAYER, "TransformerLayer", "_maybe_unflatten_for_moe", "unflatten"))
    return tuple(specs)
