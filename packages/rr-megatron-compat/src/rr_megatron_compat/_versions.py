"""What differs between megatron-core lines, computed once from the installed version.

Package metadata only: nothing here imports torch or megatron (``rr megatron`` and
``rr doctor`` read these flags on machines where importing torch fails). Patch and unpatch are
both driven by :func:`hook_specs`, so the hooks a line gets are written down in one place.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rr_core import RRError
from rr_megatron_compat._supported import SUPPORTED

DISTRIBUTION = "megatron-core"
ROUTER = "megatron.core.transformer.moe.router"
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
ROUTER_REPLAY = "megatron.core.transformer.moe.router_replay"
DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"


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
    """Version flags of one megatron-core release."""

    version: Version
    #: ``moe_enable_routing_replay`` and ``RouterReplay`` (0.16+): the native hook point.
    native_replay: bool
    #: ``topk_routing_with_score_function`` (0.14+); before that ``topk_softmax_with_capacity``.
    score_function_topk: bool
    #: ``TopKRouter.is_aux_loss_enabled`` (0.14+).
    aux_loss_enabled_method: bool
    #: ``TransformerConfig.moe_router_fusion`` (0.14+): fused routing skips every hook (C2).
    router_fusion_flag: bool
    #: ``TopKRouter.routing(logits, padding_mask)`` (0.16+).
    padding_mask: bool
    #: the router's process-group argument: none, ``model_comm_pgs`` (0.13-0.14),
    #: ``pg_collection`` (0.15+).
    router_pg_kwarg: str | None
    #: ``RouterReplay.layer_number`` (0.19+).
    replay_layer_number: bool
    #: ``TopKRouter.is_mtp_layer`` (0.17+).
    router_is_mtp_layer: bool

    @property
    def line(self) -> str:
        return f"{self.version.major}.{self.version.minor}"

    @property
    def supported(self) -> bool:
        return SpecifierSet(SUPPORTED[DISTRIBUTION]).contains(self.version, prereleases=True)


def line_flags(version: Version | str) -> MegatronLine:
    """The flags of ``version`` (pure: usable for any version string)."""
    v = Version(Version(str(version)).base_version)

    def since(minimum: str) -> bool:
        return v >= Version(minimum)

    pg_kwarg = "pg_collection" if since("0.15") else "model_comm_pgs" if since("0.13") else None
    return MegatronLine(
        version=v,
        native_replay=since("0.16"),
        score_function_topk=since("0.14"),
        aux_loss_enabled_method=since("0.14"),
        router_fusion_flag=since("0.14"),
        padding_mask=since("0.16"),
        router_pg_kwarg=pg_kwarg,
        replay_layer_number=since("0.19"),
        router_is_mtp_layer=since("0.17"),
    )


def installed_version() -> Version | None:
    try:
        return Version(importlib.metadata.version(DISTRIBUTION))
    except importlib.metadata.PackageNotFoundError:
        return None


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
    return tuple(specs)


#: Known issues of each line that matter to replay (``rr megatron`` prints them).
KNOWN_ISSUES: dict[str, tuple[str, ...]] = {
    "0.12": (
        "no TopKRouter.is_aux_loss_enabled; compute_routing_scores_for_aux_loss, "
        "group_limited_topk and apply_router_token_dropping are not all module functions "
        "(a grouped import of them fails as a whole: C6)",
        "get_transformer_layer_offset / get_num_layers_to_build take no vp_stage / pp_rank",
        "routing goes through topk_softmax_with_capacity (capacity applied after selection: C3)",
    ),
    "0.13": (
        "routing goes through topk_softmax_with_capacity",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.14": (
        "moe_router_fusion returns before any top-k hook (C2)",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.15": (
        "moe_router_fusion returns before any top-k hook (C2)",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.16": (
        "native RouterReplay: process-global list in construction order (orphans first when a "
        "model is built twice: A1), FIFO backward targets (B1), fusion skips it silently (C2)",
        "alltoall dispatcher sizes dropless output as tokens * topk (C1)",
    ),
    "0.17": ("native RouterReplay as in 0.16; MTP routers carry is_mtp_layer",),
    "0.18": ("native RouterReplay as in 0.16", "import needs triton (undeclared)"),
    "0.19": (
        "native RouterReplay gains layer_number",
        "import needs triton (undeclared)",
    ),
}
