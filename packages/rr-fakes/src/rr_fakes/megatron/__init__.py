"""Real megatron-core on CPU: the harness that shims what a machine without CUDA lacks, gloo
process groups with Megatron's parallel state, a multi-process launcher, and builders of tiny
GPTModel MoE models.

Names load on first use (PEP 562): importing this package imports neither megatron nor torch,
so the version table in ``_lines`` stays cheap to read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports
from rr_fakes.megatron._lines import MEGATRON_LINES, MEGATRON_RANGE

if TYPE_CHECKING:
    from rr_fakes.megatron._dist import ParallelSizes, free_port, gloo_group, model_parallel
    from rr_fakes.megatron._flags import (
        MegatronFlags,
        MegatronNotInstalledError,
        megatron_flags,
    )
    from rr_fakes.megatron._gpt import (
        TinyGPTConfig,
        build_gpt,
        build_gpt_chunks,
        gpt_inputs,
        train_step,
        transformer_config,
    )
    from rr_fakes.megatron._launch import RankFailedError, launch
    from rr_fakes.megatron._shims import megatron_cpu, unavailable_reason

_LAZY: dict[str, str] = {
    "ParallelSizes": "rr_fakes.megatron._dist",
    "free_port": "rr_fakes.megatron._dist",
    "gloo_group": "rr_fakes.megatron._dist",
    "model_parallel": "rr_fakes.megatron._dist",
    "MegatronFlags": "rr_fakes.megatron._flags",
    "MegatronNotInstalledError": "rr_fakes.megatron._flags",
    "megatron_flags": "rr_fakes.megatron._flags",
    "TinyGPTConfig": "rr_fakes.megatron._gpt",
    "build_gpt": "rr_fakes.megatron._gpt",
    "build_gpt_chunks": "rr_fakes.megatron._gpt",
    "gpt_inputs": "rr_fakes.megatron._gpt",
    "train_step": "rr_fakes.megatron._gpt",
    "transformer_config": "rr_fakes.megatron._gpt",
    "RankFailedError": "rr_fakes.megatron._launch",
    "launch": "rr_fakes.megatron._launch",
    "megatron_cpu": "rr_fakes.megatron._shims",
    "unavailable_reason": "rr_fakes.megatron._shims",
}

__all__ = [
    "MEGATRON_LINES",
    "MEGATRON_RANGE",
    "MegatronFlags",
    "MegatronNotInstalledError",
    "ParallelSizes",
    "RankFailedError",
    "TinyGPTConfig",
    "build_gpt",
    "build_gpt_chunks",
    "free_port",
    "gloo_group",
    "gpt_inputs",
    "launch",
    "megatron_cpu",
    "megatron_flags",
    "model_parallel",
    "train_step",
    "transformer_config",
    "unavailable_reason",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
