"""One options object for every decoder: what the answers of one rollout share.

Every decoder has the shape ``decode_x(answer, options, **keywords)``: ``options`` is a
:class:`DecodeOptions`, or a bare :class:`~rr_core.RouteMeta` that the keywords complete (the
keyword form that predates the object keeps working). Facts of one answer that the answer itself
does not carry (a bare array's token counts, an HTTP answer's prompt ids) stay keywords of the
decoder that needs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import numpy as np

from rr_core import RouteMeta, narrowest_dtype
from rr_vllm.engine_config import EngineConfig, check_engine_config
from rr_vllm.errors import DecodeOptionsError, EngineOutputError
from rr_vllm.fields import count

AbortPolicy = Literal["mask", "drop"]

#: Keyword names the engines' own vocabularies use, and the option each one sets.
ALIASES = {
    "start_len": "prompt_start",  # SGLang's routed_experts_start_len
    "vllm_version": "engine_version",
    "sglang_version": "engine_version",
}


def compact_dtype(num_experts: int) -> np.dtype[Any]:
    """:func:`rr_core.narrowest_dtype` as a numpy dtype (the engine arrays are numpy)."""
    return np.dtype(str(narrowest_dtype(num_experts)).removeprefix("torch."))


def check_policy(on_abort: object) -> None:
    if not isinstance(on_abort, str) or on_abort not in ("mask", "drop"):
        raise EngineOutputError(f"on_abort must be 'mask' or 'drop'; got {on_abort!r}")


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """How a rollout's engine answers are decoded, checked once when built.

    ``meta``: the model on the ``all_layers`` axis (expert count, top-k, layer numbers, which
    of them are MoE). ``prompt_start``: the ``routed_experts_prompt_start`` (SGLang:
    ``routed_experts_start_len``) the requests were sent with. ``on_abort``: an aborted sample is
    masked (every row invalid) or dropped (None). ``engine_version``: the engine release, where
    the answer alone cannot tell (vLLM 0.21 over HTTP, SGLang releases that ignore
    ``start_len``, streaming; checked by the engine's version parser where read).
    ``generation_only``: keep a vLLM 0.21 HTTP answer's response rows alone.
    ``engine_config``: the engine's configuration (:class:`~rr_vllm.EngineConfig`), checked
    here (E7, E8, E9) and by every decoder for a decode replica's prompt rows (D8).
    ``allow_all_zero``, ``allow_physical``, ``logical_experts``, ``validate``: the batch
    checks, as :func:`~rr_vllm.validate_samples` takes them.
    """

    meta: RouteMeta
    prompt_start: int = 0
    on_abort: AbortPolicy = "mask"
    engine_version: str | None = None
    generation_only: bool = False
    allow_all_zero: bool = False
    allow_physical: bool = False
    logical_experts: int | None = None
    validate: bool = True
    engine_config: EngineConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.meta, RouteMeta):
            raise DecodeOptionsError(
                f"DecodeOptions.meta must be an rr_core.RouteMeta; got {type(self.meta).__name__}"
            )
        object.__setattr__(self, "prompt_start", count(self.prompt_start, "prompt_start"))
        check_policy(self.on_abort)
        for name in ("generation_only", "allow_all_zero", "allow_physical", "validate"):
            if not isinstance(getattr(self, name), bool):
                raise DecodeOptionsError(f"{name} must be a bool; got {getattr(self, name)!r}")
        if self.logical_experts is not None:
            count(self.logical_experts, "logical_experts")
        if self.engine_config is not None:
            if not isinstance(self.engine_config, EngineConfig):
                raise DecodeOptionsError(
                    "engine_config must be an rr_vllm.EngineConfig (sglang_engine_config, "
                    f"vllm_engine_config); got {type(self.engine_config).__name__}"
                )
            check_engine_config(self.engine_config)

    @property
    def layer_slots(self) -> int:
        """L: the slots of the ``all_layers`` axis, one per decoder layer."""
        return len(self.meta.layer_numbers)

    @property
    def top_k(self) -> int:
        return self.meta.top_k

    @property
    def moe_slots(self) -> list[int]:
        """The slots of the MoE layers on the ``all_layers`` axis."""
        return list(self.meta.moe_slots)

    @property
    def id_dtype(self) -> np.dtype[Any]:
        """The narrowest dtype of the meta's expert ids (rr_core's), as a numpy dtype."""
        return compact_dtype(self.meta.num_experts)


class DecodeKeywords(TypedDict, total=False):
    """The keyword form of :class:`DecodeOptions` (each decoder reads the ones it documents)."""

    prompt_start: int
    start_len: int
    on_abort: AbortPolicy
    engine_version: str | None
    vllm_version: str | None
    sglang_version: str | None
    generation_only: bool
    allow_all_zero: bool
    allow_physical: bool
    logical_experts: int | None
    validate: bool
    engine_config: EngineConfig | None


def decode_options(
    options: RouteMeta | DecodeOptions,
    keywords: Mapping[str, Any],
    *,
    reads: Collection[str],
    decoder: str,
) -> DecodeOptions:
    """The options of one decoder call: ``options`` as given, or a meta completed by the
    ``keywords``; keywords on top of an options object replace its fields. A keyword the
    decoder does not read raises :class:`~rr_vllm.DecodeOptionsError` (it would be ignored)."""
    unread = sorted(k for k in keywords if k not in reads)
    if unread:
        raise DecodeOptionsError(
            f"{decoder}() does not read {', '.join(unread)}; it reads {', '.join(sorted(reads))}"
        )
    fields: dict[str, Any] = {}
    for name, value in keywords.items():
        field = ALIASES.get(name, name)
        if field == "prompt_start":
            value = count(value, name)  # named as the caller wrote it (start_len for SGLang)
        fields[field] = value
    if isinstance(options, DecodeOptions):
        return dataclasses.replace(options, **fields) if fields else options
    if isinstance(options, RouteMeta):
        return DecodeOptions(meta=options, **fields)
    raise DecodeOptionsError(
        f"{decoder}() takes a DecodeOptions or an rr_core.RouteMeta after the answer; got "
        f"{type(options).__name__}"
    )
