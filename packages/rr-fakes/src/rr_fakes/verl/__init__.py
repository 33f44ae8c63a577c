"""verl's real Megatron engine on CPU: a ``MegatronEngineWithLMHead`` over tiny GPTModels built
under verl's router replay patch, the TensorDict its ``forward_backward_batch`` consumes, and a
loss in its signature.

Names load on first use (PEP 562): importing this package imports neither verl, megatron nor
torch, so the release pins in ``_lines`` stay cheap to read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports
from rr_fakes.verl._lines import VERL_IMPORT_DEPS, VERL_MEGATRON_LINE, VERL_RELEASE

if TYPE_CHECKING:
    from rr_fakes.verl._attention import ThdCoreAttention, use_thd_attention
    from rr_fakes.verl._batch import response_logprob_loss, run_step, verl_batch
    from rr_fakes.verl._engine import (
        ModelConfig,
        Tokenizer,
        build_verl_chunks,
        unavailable_reason,
        verl_cpu,
        verl_engine,
    )
    from rr_fakes.verl._inspect import (
        RouteLog,
        grads_ok,
        moe_column,
        packed,
        perturb,
        rollout_routes,
        route_log,
        routers,
        zero_grads,
    )
    from rr_fakes.verl._pipeline import pipeline_r2_rank
    from rr_fakes.verl._tiny import (
        BATCHINGS,
        LENGTHS,
        PROMPTS,
        RECOMPUTE,
        RESPONSES,
        tiny_config,
    )

_LAZY: dict[str, str] = {
    "pipeline_r2_rank": "rr_fakes.verl._pipeline",
    "BATCHINGS": "rr_fakes.verl._tiny",
    "LENGTHS": "rr_fakes.verl._tiny",
    "PROMPTS": "rr_fakes.verl._tiny",
    "RECOMPUTE": "rr_fakes.verl._tiny",
    "RESPONSES": "rr_fakes.verl._tiny",
    "tiny_config": "rr_fakes.verl._tiny",
    "RouteLog": "rr_fakes.verl._inspect",
    "grads_ok": "rr_fakes.verl._inspect",
    "moe_column": "rr_fakes.verl._inspect",
    "packed": "rr_fakes.verl._inspect",
    "perturb": "rr_fakes.verl._inspect",
    "rollout_routes": "rr_fakes.verl._inspect",
    "route_log": "rr_fakes.verl._inspect",
    "routers": "rr_fakes.verl._inspect",
    "zero_grads": "rr_fakes.verl._inspect",
    "ThdCoreAttention": "rr_fakes.verl._attention",
    "use_thd_attention": "rr_fakes.verl._attention",
    "response_logprob_loss": "rr_fakes.verl._batch",
    "run_step": "rr_fakes.verl._batch",
    "verl_batch": "rr_fakes.verl._batch",
    "ModelConfig": "rr_fakes.verl._engine",
    "Tokenizer": "rr_fakes.verl._engine",
    "build_verl_chunks": "rr_fakes.verl._engine",
    "unavailable_reason": "rr_fakes.verl._engine",
    "verl_cpu": "rr_fakes.verl._engine",
    "verl_engine": "rr_fakes.verl._engine",
}

__all__ = [
    "BATCHINGS",
    "LENGTHS",
    "PROMPTS",
    "RECOMPUTE",
    "RESPONSES",
    "VERL_IMPORT_DEPS",
    "VERL_MEGATRON_LINE",
    "VERL_RELEASE",
    "ModelConfig",
    "RouteLog",
    "ThdCoreAttention",
    "Tokenizer",
    "build_verl_chunks",
    "grads_ok",
    "moe_column",
    "packed",
    "perturb",
    "pipeline_r2_rank",
    "response_logprob_loss",
    "rollout_routes",
    "route_log",
    "routers",
    "run_step",
    "tiny_config",
    "unavailable_reason",
    "use_thd_attention",
    "verl_batch",
    "verl_cpu",
    "verl_engine",
    "zero_grads",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
