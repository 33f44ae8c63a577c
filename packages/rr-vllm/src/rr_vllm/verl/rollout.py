"""verl's rollout side through rr: :data:`ADAPTER`, which ``rr_megatron_compat.verl.install()``
switches with every other verl side (``ADAPTER.install()`` installs this side alone).

verl 0.9.1 widens each agent-loop sample's engine rows to int16 and pads them to
``[1, prompt_length + response_length, L, K]`` (``AgentLoopWorker._agent_loop_postprocess``),
stacks them into the batch the agent-loop worker hands the trainer (``_postprocess``) and cuts
that to the jagged tensor its engines read (``left_right_2_no_padding``), checking nothing on
the way. Installed, rr takes both ends:

- **the agent loop**: each sample's rows are validated as the agent loop hands them over (shape
  against the model's config, ids in range, K distinct ids, empty dense slots, no all-zero
  capture; rows missing at the end only where no trained token follows them) and stored compact,
  one one-sample :class:`~rr_vllm.VerlRoutes` per sample in the batch's non-tensor field
  :data:`FIELD` (an object array, so verl's reorder, balance, split and concat carry it along);
- **the trainer's batch**: ``left_right_2_no_padding`` returns verl's own jagged int16
  ``routed_experts`` from them, checked sample by sample against the batch's token counts.

Shapes: B samples, P prompt and G response tokens of a sample (T = P + G), N rows the engine
returned, L decoder layers, K top-k.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import numpy as np

from rr_core import AlignmentError, ReplayError, RouteMeta
from rr_core.codecs.encoding import check_codec
from rr_core.verl_release import VERL_SPECIFIER
from rr_vllm.capture import route_meta_of
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import attr, token_count
from rr_vllm.samples import SampleRoutes, as_rows
from rr_vllm.validate import check_all_layers
from rr_vllm.verl.arrival import VerlSide, expands_in_workers
from rr_vllm.verl.expand import FIELD, check_parts, expand_samples, items_of, trained_samples
from rr_vllm.verl.routes import VerlRoutes, pack_for_verl

#: The verl releases whose agent loop and padding rr hooks (``install(force=True)`` passes
#: another one): rr's one verl policy.
VERL_ROLLOUT_SPECIFIER = VERL_SPECIFIER
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
PADDING = "verl.workers.utils.padding"


def compact_sample(output: Any, meta: RouteMeta, *, codec: str = "packed") -> VerlRoutes:
    """One agent-loop output's routes as a one-sample :class:`~rr_vllm.VerlRoutes`.

    ``output`` is what verl's agent loops build (``AgentLoopOutput``: ``prompt_ids``,
    ``response_ids``, ``response_mask`` and the engine's ``routed_experts`` ``[N, L, K]``, rows
    from the prompt's first token on). N is ``T - 1`` after one generation (the last sampled
    token was never routed), T when verl cut the response (``response_length``) and fewer when a
    multi-turn trajectory ends in tokens the engine never saw (tool output): rows from N on carry
    no route, which is refused where a trained token (``response_mask`` 1) follows them, since
    verl would replay expert 0 there and that changes the trained token's log-prob."""
    what = "the agent loop's routed_experts"
    check_all_layers(meta)
    codec = check_codec(codec)
    field = {n: attr(output, n, "the agent-loop output") for n in _OUTPUT_FIELDS}
    p = token_count(field["prompt_ids"], "the agent loop's prompt_ids")
    g = token_count(field["response_ids"], "the agent loop's response_ids")
    mask = _response_mask(field["response_mask"], g)
    rows = as_rows(field["routed_experts"], what)
    n, t = rows.shape[0], p + g
    shape = (len(meta.layer_numbers), meta.top_k)
    if rows.shape[1:] != shape:
        raise EngineOutputError(
            f"{what} has shape {rows.shape}; the model's config says [rows, {shape[0]}, "
            f"{shape[1]}] (every decoder layer, top-{meta.top_k}): routes of another model?"
        )
    if n > t:
        raise AlignmentError(
            f"{what} has {n} rows for a sample of {t} tokens (P={p}, G={g}): more rows than "
            "tokens, so rows and tokens cannot line up"
        )
    _check_trained_tail(n, p, mask, what)
    routes_TLK = np.zeros((t, *shape), dtype=rows.dtype)
    routes_TLK[:n] = rows
    valid_T = np.zeros(t, dtype=bool)
    valid_T[:n] = True
    sample = SampleRoutes(
        routes_TLK=routes_TLK,
        valid_T=valid_T,
        num_prompt_tokens=p,
        prompt_start=0,
        finish_reason=None,
    )
    return pack_for_verl([sample], meta, codec=codec)


#: What :func:`compact_sample` reads of an agent-loop output.
_OUTPUT_FIELDS = ("prompt_ids", "response_ids", "response_mask", "routed_experts")


def _response_mask(value: Any, g: int) -> np.ndarray:
    """verl's response mask (1 trained, 0 not) as an integer array of one entry per token."""
    try:
        mask = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged lists, objects numpy cannot read
        raise AlignmentError(f"the agent loop's response_mask is unreadable ({e})") from e
    if mask.shape != (g,) or (g and mask.dtype.kind not in "biu"):
        raise AlignmentError(
            f"the agent loop's response_mask has shape {mask.shape} and dtype {mask.dtype}; "
            f"expected ({g},) integers, one per response token"
        )
    return mask


def _check_trained_tail(n: int, p: int, mask: np.ndarray, what: str) -> None:
    """Row i routes token i, whose output predicts token i + 1: a routeless row from n on
    changes a trained log-prob iff a response token after position n has mask 1."""
    later = mask[max(0, n + 1 - p) :]
    trained = np.flatnonzero(later)
    if trained.size:
        first = p + max(0, n + 1 - p) + int(trained[0])
        raise EngineOutputError(
            f"{what} has {n} rows, so tokens {n}..{p + mask.size - 1} carry no route, but token "
            f"{first} (a trained response token, response_mask 1) is predicted from them: verl "
            "would replay expert 0 there. The engine's routes must cover the trajectory up to "
            "its last generated token (pass the last turn's routed_experts). "
            "D2: see `rr explain D2`"
        )


# -- the hooks -----------------------------------------------------------------------------------


def compacted_output(worker: Any, output: Any) -> Any:
    """``output`` (verl's ``AgentLoopOutput``) with its routes validated and moved, compact,
    into ``extra_fields`` (which verl turns into the batch's non-tensor fields), so verl's int16
    copy is never built. Unchanged where it has no routes, or where this process's rollout side
    is not installed (verl's own path then carries the routes, which the trainer reads too)."""
    if getattr(output, "routed_experts", None) is None or not ADAPTER.install_requested:
        return output
    routes = compact_sample(output, _meta_of(worker), codec=ADAPTER.codec)
    return output.model_copy(
        update={"routed_experts": None, "extra_fields": {**output.extra_fields, FIELD: routes}}
    )


def compacting_worker(verls: Any) -> type:
    """verl's ``AgentLoopWorker`` whose ``_agent_loop_postprocess`` compacts each sample's
    routes first (:func:`compacted_output`). A subclass, not a wrapper on verl's method: verl's
    trainer ships the class to the agent-loop worker processes with ``ray.remote``, and Ray
    copies an actor class's methods into the class it pickles (its tracing wrappers), where a
    wrapper set on verl's class would be pickled as verl's bare function and shadow the worker's
    own patch; a subclass's method travels with the class (Ray 2.60, verl 0.9.1)."""

    async def _agent_loop_postprocess(self: Any, output: Any, validate: Any, **kwargs: Any) -> Any:
        compact = compacted_output(self, output)
        return await verls._agent_loop_postprocess(self, compact, validate, **kwargs)

    _agent_loop_postprocess.__qualname__ = f"{verls.__name__}._agent_loop_postprocess"
    namespace = {
        "_agent_loop_postprocess": _agent_loop_postprocess,
        "__module__": __name__,
        "__doc__": f"{verls.__doc__ or ''}\n\nrr: each sample's routes stored compact.",
        "rr_verl_class": verls,
    }
    return type(verls.__name__, (verls,), namespace)


def _meta_of(worker: Any) -> RouteMeta:
    config = getattr(getattr(worker, "model_config", None), "hf_config", None)
    if config is None:
        raise ReplayError(
            "rr reads the model's geometry from the agent-loop worker's model_config.hf_config "
            f"(verl's HFModelConfig); {type(worker).__name__} has none"
        )
    return route_meta_of(config)


def _expand_for_trainer(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``left_right_2_no_padding(data)`` with the compact routes checked against the batch's
    sequences, then left compact for the workers where rr's arrival side is in place (it
    expands them in the worker, so the routes cross Ray as rr's payload; the switch installs it
    in every process, this one among them), else expanded here into verl's jagged
    ``routed_experts``."""
    data = args[0] if args else kwargs["data"]
    keys = data.keys()  # a TensorDict refuses `in` on itself
    if FIELD not in keys:
        return wrapped(*args, **kwargs)
    parts = items_of(data.get(FIELD), data.batch_size[0])
    if "routed_experts" in keys and any(p is not None for p in parts):
        raise ReplayError(
            "the batch holds the rollout's routes (R3) and routed_experts recorded by the "
            "trainer (R2) at once: enable one of router_replay.mode='R2' and "
            "enable_rollout_routing_replay"
        )
    trained_B = trained_samples(data)
    out = wrapped(*args, **kwargs)
    offsets = out["input_ids"].offsets()
    if expands_in_workers():
        check_parts(parts, offsets, trained_B)  # refused here, before it crosses Ray
        return out
    del out[FIELD]
    routes = expand_samples(parts, offsets, trained_B)
    if routes is not None:
        out["routed_experts"] = routes
    return out


def _is_verl(module_name: str) -> bool:
    return module_name.startswith("verl.")


# -- the adapter ---------------------------------------------------------------------------------


class VerlRolloutAdapter(VerlSide):
    """verl's agent loop and its padding switched to rr's compact routes. Install-only: there
    are no routers on this side (the trainer's are attached by the trainer's adapter,
    :mod:`rr_megatron_compat.verl` or :mod:`rr_transformers.verl`)."""

    name = "verl-rollout"
    module = "rr_vllm.verl"
    #: The verl module whose import installs this side under rr_megatron_compat.verl.install():
    #: the agent loop, which the agent-loop workers and the trainer that drives them import (the
    #: install hooks the trainer's padding then). Not the padding module: verl's task runner
    #: imports it while ``verl.trainer.distillation`` is half-initialised (``main_ppo`` ->
    #: ``main_ppo_v0``), and the install's import of the agent loop, which imports that module,
    #: failed there: every job with the one switch stopped at start (verl 0.9.1).
    verl_modules = (AGENT_LOOP,)
    what = "rr's verl rollout side"

    def __init__(self) -> None:
        super().__init__()
        self.codec = "packed"
        self.worker: type | None = None  # verl's AgentLoopWorker, compacting

    def _uninstall(self) -> int:
        """verl's classes and functions back, also in verl modules that copied them by name
        while installed (the subclass passes through there once uninstalled)."""
        worker, removed = self.worker, self.patches.restore()
        if worker is not None:
            verls = worker.rr_verl_class  # type: ignore[attr-defined]
            removed += self.patches.restore_copies(
                worker, verls, "AgentLoopWorker", within=_is_verl
            )
        return removed

    def install(self, *, force: bool = False, codec: str = "packed") -> tuple[str, ...]:
        """Hook verl's agent loop and padding; ``codec`` is the payload each sample is stored in
        (``raw``, ``packed`` or ``set``; see :mod:`rr_core.codecs`). Idempotent."""
        self.codec = check_codec(codec)
        return super().install(force=force)

    def _hook(self) -> None:
        verls = importlib.import_module(AGENT_LOOP).AgentLoopWorker
        verls = getattr(verls, "rr_verl_class", verls)  # a copy of an earlier install's
        self.worker = compacting_worker(verls)
        self.patches.set_copies(verls, self.worker, "AgentLoopWorker", within=_is_verl)
        padding = importlib.import_module(PADDING)
        theirs = padding.left_right_2_no_padding
        ours = self.patches.wrap(padding, "left_right_2_no_padding", _expand_for_trainer)
        # verl's PPO trainer copied it by name; a copy taken while an earlier install was in
        # place holds that install's proxy, which passes through since: hooked again too
        self.patches.set_copies(theirs, ours, "left_right_2_no_padding", within=_is_verl)


ADAPTER = VerlRolloutAdapter()
uninstall, is_installed = ADAPTER.uninstall, ADAPTER.is_installed


def install(*, force: bool = False, codec: str = "packed") -> tuple[str, ...]:
    """Deprecated: ``rr_megatron_compat.verl.install()`` switches every verl side, this one
    among them (``ADAPTER.install`` hooks this side alone, with its ``codec``)."""
    warnings.warn(
        "rr_vllm.verl.install() is deprecated and goes in the next release: "
        "rr_megatron_compat.verl.install() switches every verl side present, the rollout among "
        "them (rr_vllm.verl.ADAPTER.install(codec=...) hooks this side alone)",
        DeprecationWarning,
        stacklevel=2,
    )
    return ADAPTER.install(force=force, codec=codec)


def attach(*args: Any, **kwargs: Any) -> Any:
    """Deprecated (it always raised): the rollout side has no routers to attach."""
    raise ReplayError(
        "the rollout side has no routers to attach: attach the trainer's model with "
        "rr_megatron_compat.verl or rr_transformers.verl"
    )


detach = attach
