"""rr_megatron_compat: exact routing replay inside real megatron-core 0.12 to 0.19.

``install()`` hooks Megatron's router (native ``RouterReplay`` on 0.16+, the router's top-k
step before), ``enable_replay(config)`` sets the replay flag on a config instance, and
``attach(controller, model)`` hands a model's routers to an :class:`rr_core.ReplayController`.
Names load on first use: importing this package (or reading ``SUPPORTED``) imports neither
torch nor megatron.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports
from rr_megatron_compat._supported import SUPPORTED as SUPPORTED

if TYPE_CHECKING:
    from rr_megatron_compat._attach import attach as attach
    from rr_megatron_compat._config import enable_replay as enable_replay
    from rr_megatron_compat._config import replay_enabled as replay_enabled
    from rr_megatron_compat._dispatcher import count_routed_tokens as count_routed_tokens
    from rr_megatron_compat._guards import ReplayConfigError as ReplayConfigError
    from rr_megatron_compat._guards import (
        ReplayNotEquivalentWarning as ReplayNotEquivalentWarning,
    )
    from rr_megatron_compat._guards import check_replay_config as check_replay_config
    from rr_megatron_compat._install import RRProxy as RRProxy
    from rr_megatron_compat._install import install as install
    from rr_megatron_compat._install import installed_hooks as installed_hooks
    from rr_megatron_compat._install import is_installed as is_installed
    from rr_megatron_compat._install import uninstall as uninstall
    from rr_megatron_compat._layout import current_pipeline_rank as current_pipeline_rank
    from rr_megatron_compat._layout import layout_config as layout_config
    from rr_megatron_compat._layout import parse_moe_layer_freq as parse_moe_layer_freq
    from rr_megatron_compat._pipeline import merge_stage_routes as merge_stage_routes
    from rr_megatron_compat._pipeline import pp_gather as pp_gather
    from rr_megatron_compat._pipeline import rank_moe_layer_numbers as rank_moe_layer_numbers
    from rr_megatron_compat._pipeline import split_rank_routes as split_rank_routes
    from rr_megatron_compat._pipeline import stack_rank_routes as stack_rank_routes
    from rr_megatron_compat._stats import ignore_unreplayed_rows as ignore_unreplayed_rows
    from rr_megatron_compat._tokens import CP_LAYOUTS as CP_LAYOUTS
    from rr_megatron_compat._tokens import CPLayout as CPLayout
    from rr_megatron_compat._tokens import PackedRoutes as PackedRoutes
    from rr_megatron_compat._tokens import batch_to_router_rows as batch_to_router_rows
    from rr_megatron_compat._tokens import cp_chunk_ids as cp_chunk_ids
    from rr_megatron_compat._tokens import cp_gather as cp_gather
    from rr_megatron_compat._tokens import cp_merge as cp_merge
    from rr_megatron_compat._tokens import cp_rank_size as cp_rank_size
    from rr_megatron_compat._tokens import cp_split as cp_split
    from rr_megatron_compat._tokens import packed_seq_params as packed_seq_params
    from rr_megatron_compat._tokens import router_rows_to_batch as router_rows_to_batch
    from rr_megatron_compat._tokens import sp_alignment as sp_alignment
    from rr_megatron_compat._tokens import sp_gather as sp_gather
    from rr_megatron_compat._tokens import sp_pad as sp_pad
    from rr_megatron_compat._tokens import sp_scatter as sp_scatter
    from rr_megatron_compat._tokens import thd_cp_index as thd_cp_index
    from rr_megatron_compat._tokens import thd_pack as thd_pack
    from rr_megatron_compat._tokens import thd_unpack as thd_unpack
    from rr_megatron_compat._versions import MegatronLine as MegatronLine
    from rr_megatron_compat._versions import (
        MegatronNotInstalledError as MegatronNotInstalledError,
    )
    from rr_megatron_compat._versions import (
        UnsupportedMegatronError as UnsupportedMegatronError,
    )
    from rr_megatron_compat._versions import hook_specs as hook_specs
    from rr_megatron_compat._versions import line_flags as line_flags
    from rr_megatron_compat._versions import megatron_line as megatron_line
    from rr_megatron_compat._wire import all_gather_exact as all_gather_exact

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "attach": "rr_megatron_compat._attach",
    "enable_replay": "rr_megatron_compat._config",
    "replay_enabled": "rr_megatron_compat._config",
    "count_routed_tokens": "rr_megatron_compat._dispatcher",
    "ReplayConfigError": "rr_megatron_compat._guards",
    "ReplayNotEquivalentWarning": "rr_megatron_compat._guards",
    "check_replay_config": "rr_megatron_compat._guards",
    "RRProxy": "rr_megatron_compat._install",
    "install": "rr_megatron_compat._install",
    "installed_hooks": "rr_megatron_compat._install",
    "is_installed": "rr_megatron_compat._install",
    "uninstall": "rr_megatron_compat._install",
    "ignore_unreplayed_rows": "rr_megatron_compat._stats",
    "MegatronLine": "rr_megatron_compat._versions",
    "MegatronNotInstalledError": "rr_megatron_compat._versions",
    "UnsupportedMegatronError": "rr_megatron_compat._versions",
    "hook_specs": "rr_megatron_compat._versions",
    "line_flags": "rr_megatron_compat._versions",
    "megatron_line": "rr_megatron_compat._versions",
    "current_pipeline_rank": "rr_megatron_compat._layout",
    "layout_config": "rr_megatron_compat._layout",
    "parse_moe_layer_freq": "rr_megatron_compat._layout",
    "CP_LAYOUTS": "rr_megatron_compat._tokens",
    "CPLayout": "rr_megatron_compat._tokens",
    "PackedRoutes": "rr_megatron_compat._tokens",
    "batch_to_router_rows": "rr_megatron_compat._tokens",
    "cp_chunk_ids": "rr_megatron_compat._tokens",
    "cp_gather": "rr_megatron_compat._tokens",
    "cp_merge": "rr_megatron_compat._tokens",
    "cp_rank_size": "rr_megatron_compat._tokens",
    "cp_split": "rr_megatron_compat._tokens",
    "packed_seq_params": "rr_megatron_compat._tokens",
    "router_rows_to_batch": "rr_megatron_compat._tokens",
    "sp_alignment": "rr_megatron_compat._tokens",
    "sp_gather": "rr_megatron_compat._tokens",
    "sp_pad": "rr_megatron_compat._tokens",
    "sp_scatter": "rr_megatron_compat._tokens",
    "thd_cp_index": "rr_megatron_compat._tokens",
    "thd_pack": "rr_megatron_compat._tokens",
    "thd_unpack": "rr_megatron_compat._tokens",
    "merge_stage_routes": "rr_megatron_compat._pipeline",
    "pp_gather": "rr_megatron_compat._pipeline",
    "rank_moe_layer_numbers": "rr_megatron_compat._pipeline",
    "split_rank_routes": "rr_megatron_compat._pipeline",
    "stack_rank_routes": "rr_megatron_compat._pipeline",
    "all_gather_exact": "rr_megatron_compat._wire",
}

__all__ = sorted([*_LAZY, "SUPPORTED", "__version__"])

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
