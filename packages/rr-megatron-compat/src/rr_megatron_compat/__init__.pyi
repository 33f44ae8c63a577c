"""The public names of rr_megatron_compat, each listed once.
``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from ._config import (
    enable_replay as enable_replay,
    replay_config_fields as replay_config_fields,
    replay_enabled as replay_enabled,
)
from ._dispatcher import (
    count_routed_tokens as count_routed_tokens,
)
from ._guards import (
    ReplayConfigError as ReplayConfigError,
    ReplayNotEquivalentWarning as ReplayNotEquivalentWarning,
    check_replay_config as check_replay_config,
)
from ._install import (
    ADAPTER as ADAPTER,
    MegatronAdapter as MegatronAdapter,
    RRProxy as RRProxy,
    attach as attach,
    detach as detach,
    install as install,
    installed_hooks as installed_hooks,
    is_installed as is_installed,
    uninstall as uninstall,
)
from ._layout import (
    current_pipeline_rank as current_pipeline_rank,
    layout_config as layout_config,
    parse_moe_layer_freq as parse_moe_layer_freq,
)
from ._pipeline import (
    merge_stage_routes as merge_stage_routes,
    pp_gather as pp_gather,
    rank_moe_layer_numbers as rank_moe_layer_numbers,
    split_rank_routes as split_rank_routes,
    stack_rank_routes as stack_rank_routes,
)
from ._schedule import (
    replay_forward_step as replay_forward_step,
)
from ._supported import (
    SUPPORTED as SUPPORTED,
)
from ._tokens import (
    CP_LAYOUTS as CP_LAYOUTS,
    CPLayout as CPLayout,
    PackedRoutes as PackedRoutes,
    batch_to_router_rows as batch_to_router_rows,
    cp_chunk_ids as cp_chunk_ids,
    cp_gather as cp_gather,
    cp_merge as cp_merge,
    cp_split as cp_split,
    packed_seq_params as packed_seq_params,
    router_rows_to_batch as router_rows_to_batch,
    sp_alignment as sp_alignment,
    sp_gather as sp_gather,
    sp_pad as sp_pad,
    sp_scatter as sp_scatter,
    thd_cp_index as thd_cp_index,
    thd_pack as thd_pack,
    thd_unpack as thd_unpack,
)
from ._versions import (
    MegatronLine as MegatronLine,
    MegatronNotInstalledError as MegatronNotInstalledError,
    UnsupportedMegatronError as UnsupportedMegatronError,
    hook_specs as hook_specs,
    line_flags as line_flags,
    megatron_line as megatron_line,
)
from ._wire import (
    all_gather_exact as all_gather_exact,
)

__version__: str
