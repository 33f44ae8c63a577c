"""The public names of rr_fakes.shims.megatron, each listed once. ``__init__.py`` loads
each name from its module on first use (lazy_loader)."""

from ._capture import (
    RouteLog as RouteLog,
    map_ids as map_ids,
    route_log as route_log,
)
from ._dist import (
    ParallelSizes as ParallelSizes,
    free_port as free_port,
    gloo_group as gloo_group,
    model_parallel as model_parallel,
)
from ._flags import (
    MegatronFlags as MegatronFlags,
    MegatronNotInstalledError as MegatronNotInstalledError,
    megatron_flags as megatron_flags,
)
from ._gpt import (
    RECOMPUTE as RECOMPUTE,
    TinyGPTConfig as TinyGPTConfig,
    build_gpt as build_gpt,
    build_gpt_chunks as build_gpt_chunks,
    gpt_inputs as gpt_inputs,
    train_step as train_step,
    transformer_config as transformer_config,
)
from ._launch import (
    RankFailedError as RankFailedError,
    launch as launch,
)
from ._lines import (
    MEGATRON_LINES as MEGATRON_LINES,
    MEGATRON_RANGE as MEGATRON_RANGE,
)
from ._shims import (
    megatron_compiled as megatron_compiled,
    megatron_cpu as megatron_cpu,
    unavailable_reason as unavailable_reason,
)
