"""TRL's colocated vLLM engine with route capture on, and its answers decoded.

TRL builds ``LLM(...)`` in ``VLLMGeneration.__init__`` (the name imported at the top of
``trl.generation.vllm_generation``) and calls ``self.llm.generate`` once per rollout, one
``RequestOutput`` per prompt row (``n=1``; with tensor parallelism every rank of the group
generates the group's prompts and keeps its own slice). rr adds the capture arguments for the
model's geometry to the engine's construction, records the engine's configuration as the routes'
provenance, and decodes each rollout's answers with ``rr_vllm`` into per-row routes for the
trainer (:mod:`rr_transformers.trl._rows`).
"""

from __future__ import annotations

import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from rr_transformers.trl._errors import TrlReplayError
from rr_transformers.trl._rows import RowRoutes, split_rows


@dataclass
class Engine:
    """What rr knows of one TRL engine: the routes' layout and the engine's configuration."""

    meta: Any  # rr_core.RouteMeta of the answers (all-layers axis)
    provenance: dict[str, Any]


@dataclass
class Rollout:
    """The rows of the rollout the current ``VLLMGeneration.generate`` call produced."""

    engine: Engine | None = None
    rows: list[RowRoutes] = field(default_factory=list)
    seconds: float = 0.0  # decoding time, rr's own


_ENGINES: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()
#: Set while TRL's ``VLLMGeneration.generate`` runs: where ``LLM.generate`` leaves its rows.
_ROLLOUT: ContextVar[Rollout | None] = ContextVar("rr_trl_rollout", default=None)


def build_llm(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``LLM(...)`` as TRL calls it, with route capture for the model's geometry."""
    from transformers import AutoConfig

    from rr_vllm import ModelGeometry, route_meta_of, vllm_engine_args, vllm_engine_config

    if args:
        raise TrlReplayError(
            f"TRL built its vLLM engine with {len(args)} positional arguments; rr reads the "
            "engine's settings by keyword (TRL 1.16 passes them so)"
        )
    config = AutoConfig.from_pretrained(
        kwargs["model"], trust_remote_code=bool(kwargs.get("trust_remote_code"))
    )
    engine_config = vllm_engine_config(kwargs)
    capture = vllm_engine_args(ModelGeometry.from_hf_config(config), engine_config=engine_config)
    clash = {k for k in capture if k in kwargs and kwargs[k] != capture[k]}
    if clash:
        raise TrlReplayError(
            f"TRL's engine settings {sorted(clash)} contradict what route capture needs "
            f"({ {k: capture[k] for k in sorted(clash)} })"
        )
    llm = wrapped(**{**kwargs, **capture})
    dtype = str(getattr(llm.llm_engine.model_config, "dtype", "")).removeprefix("torch.")
    provenance = {**engine_config.provenance(), "routing_precision": dtype or None}
    _ENGINES[llm] = Engine(route_meta_of(config), provenance)
    return llm


def generate_rollout(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``VLLMGeneration.generate``: the rollout's routes kept for the trainer, sliced to this
    rank's rows as TRL slices its completions."""
    rollout = Rollout()
    token = _ROLLOUT.set(rollout)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _ROLLOUT.reset(token)
    tp = int(getattr(instance, "tensor_parallel_size", 1))
    if tp > 1:
        import torch.distributed as dist

        local = len(result[1])
        rank = dist.get_rank(group=instance.tp_group)
        rollout.rows = rollout.rows[rank * local : (rank + 1) * local]
    if len(rollout.rows) != len(result[1]):
        raise TrlReplayError(
            f"the engine answered {len(rollout.rows)} completions with routes for "
            f"{len(result[1])} rows TRL keeps"
        )
    pending.set(rollout)
    return result


#: The last rollout's rows, read by the trainer's hook of ``_generate_and_score_completions``.
pending: ContextVar[Rollout | None] = ContextVar("rr_trl_pending", default=None)


def llm_generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``LLM.generate``: inside TRL's rollout, the answers decoded into per-row routes."""
    rollout = _ROLLOUT.get()
    outputs = wrapped(*args, **kwargs)
    if rollout is None:
        return outputs  # someone else's call on an engine
    engine = _ENGINES.get(instance)
    if engine is None:
        raise TrlReplayError(
            "TRL's engine was built before rr_transformers.trl.install(): it returns no routes; "
            "install before creating the GRPOTrainer"
        )
    from rr_vllm import DecodeOptions, decode_vllm_output

    start = time.perf_counter()
    batch = decode_vllm_output(list(outputs), DecodeOptions(meta=engine.meta)).to_batch()
    rows = split_rows(batch, outputs)
    rollout.engine, rollout.rows = engine, rows
    rollout.seconds += time.perf_counter() - start
    return outputs


def engine_of(llm: Any) -> Engine | None:
    return _ENGINES.get(llm)


def engine_provenance(trainer: Any) -> dict[str, Any] | None:
    """Where ``trainer``'s routes come from, as rr recorded its engine at construction (the
    vLLM release, the dtype the router ran in, speculative mode, prefix caching); None for a
    trainer whose engine rr did not build."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    engine = None if llm is None else _ENGINES.get(llm)
    return None if engine is None else dict(engine.provenance)
