"""The public names of rr_fakes.shims.verl, each listed once. ``__init__.py`` loads
each name from its module on first use (lazy_loader)."""

from ._agent_loop import (
    agent_loop_batch as agent_loop_batch,
    agent_loop_worker as agent_loop_worker,
)
from ._attention import (
    ThdCoreAttention as ThdCoreAttention,
    use_thd_attention as use_thd_attention,
)
from ._batch import (
    response_logprob_loss as response_logprob_loss,
    run_step as run_step,
    verl_batch as verl_batch,
)
from ._engine import (
    ModelConfig as ModelConfig,
    Tokenizer as Tokenizer,
    build_verl_chunks as build_verl_chunks,
    unavailable_reason as unavailable_reason,
    verl_cpu as verl_cpu,
    verl_engine as verl_engine,
)
from ._inspect import (
    RouteLog as RouteLog,
    grads_ok as grads_ok,
    moe_column as moe_column,
    packed as packed,
    perturb as perturb,
    rollout_routes as rollout_routes,
    route_log as route_log,
    routed_as as routed_as,
    routers as routers,
    zero_grads as zero_grads,
)
from ._lines import (
    VERL_IMPORT_DEPS as VERL_IMPORT_DEPS,
    VERL_MEGATRON_LINE as VERL_MEGATRON_LINE,
    VERL_RELEASE as VERL_RELEASE,
)
from ._pipeline import (
    pipeline_r2_rank as pipeline_r2_rank,
)
from ._tiny import (
    BATCHINGS as BATCHINGS,
    LENGTHS as LENGTHS,
    PROMPTS as PROMPTS,
    RECOMPUTE as RECOMPUTE,
    RESPONSES as RESPONSES,
    tiny_config as tiny_config,
)
