"""One options object for every decoder: what the answers of one rollout share.

Every decoder has the shape ``decode_x(answer, options, /, *, facts)`` and returns
:class:`~rr_vllm.DecodedRoutes`: ``options`` is a :class:`DecodeOptions`; the facts are what the
answer itself does not carry, named alike in every decoder (``num_prompt_tokens``,
``num_generated_tokens``, ``finish_reason``; ``prompt_starts`` for a batch sent with one start
per request).

The form that predates the object (a bare :class:`~rr_core.RouteMeta` completed by option
keywords, the engines' aliases ``start_len`` / ``vllm_version`` / ``sglang_version``) keeps
working for one release: it gets the result it always got and a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import numpy as np

from rr_core import RouteMeta, RouteValidationError, narrowest_dtype
from rr_vllm.engine_config import EngineConfig, check_engine_config
from rr_vllm.errors import DecodeOptionsError, EngineOutputError
from rr_vllm.fields import count

AbortPolicy = Literal["mask", "drop"]

#: Keyword names the engines' own vocabularies use, and the option each one sets (the
#: deprecated keyword form only: :class:`DecodeOptions` names each option once).
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


def check_all_layers(meta: RouteMeta) -> None:
    """Engine routes are on the ``all_layers`` axis: a meta on another raises."""
    if not isinstance(meta, RouteMeta):
        raise RouteValidationError(f"meta must be a RouteMeta; got {type(meta).__name__}")
    if meta.layer_axis != "all_layers":
        raise RouteValidationError(
            f"engine routes are on the all_layers axis; got meta.layer_axis={meta.layer_axis!r}"
        )


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
    #: Read from ``meta`` once (every decoder reads them per sample): L, K, the MoE slots, and
    #: rr_core's narrowest id dtype as a numpy dtype.
    layer_slots: int = field(init=False, repr=False, compare=False)
    top_k: int = field(init=False, repr=False, compare=False)
    moe_slots: list[int] = field(init=False, repr=False, compare=False)
    id_dtype: np.dtype[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, RouteMeta):
            raise DecodeOptionsError(
                f"DecodeOptions.meta must be an rr_core.RouteMeta; got {type(self.meta).__name__}"
            )
        check_all_layers(self.meta)
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
        object.__setattr__(self, "layer_slots", len(self.meta.layer_numbers))
        object.__setattr__(self, "top_k", self.meta.top_k)
        object.__setattr__(self, "moe_slots", list(self.meta.moe_slots))
        object.__setattr__(self, "id_dtype", compact_dtype(self.meta.num_experts))


class DecodeKeywords(TypedDict, total=False):
    """The deprecated keyword form of :class:`DecodeOptions` (each decoder reads the ones it
    documents)."""

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
    decoder does not read raises :class:`~rr_vllm.DecodeOptionsError` (it would be ignored).
    Either of the last two is the deprecated form (see :func:`is_legacy`)."""
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


def resolve(
    options: RouteMeta | DecodeOptions,
    keywords: Mapping[str, Any],
    *,
    reads: Collection[str],
    decoder: str,
) -> tuple[DecodeOptions, bool]:
    """A decoder's options (:func:`decode_options`) and whether it was called in the deprecated
    form (:func:`is_legacy`, which warns)."""
    legacy = is_legacy(options, keywords, decoder=decoder)
    return decode_options(options, keywords, reads=reads, decoder=decoder), legacy


def is_legacy(options: object, keywords: Mapping[str, Any], *, decoder: str) -> bool:
    """Whether a decoder was called in the form that predates :class:`DecodeOptions` (a bare
    meta, or option keywords): if so, a DeprecationWarning names the call to write instead,
    and the decoder returns what that form always returned."""
    if isinstance(options, DecodeOptions) and not keywords:
        return False
    if not isinstance(options, DecodeOptions | RouteMeta):
        return False  # decode_options names the wrong type
    names = ", ".join(f"{ALIASES.get(k, k)}=" for k in keywords) or "(defaults)"
    warnings.warn(
        f"{decoder}(answer, meta, **options) is deprecated and goes in the next release: build "
        f"the options once, DecodeOptions(meta=meta, {names}), and call {decoder}(answer, "
        "options); it returns DecodedRoutes (index it for a sample, .to_batch() for the batch)",
        DeprecationWarning,
        stacklevel=4,
    )
    return True


def warn_renamed(decoder: str, old: str, new: str) -> None:
    """A fact keyword under its old name (``prompt_tokens``, ``prompt_token_ids``)."""
    warnings.warn(
        f"{decoder}(..., {old}=) is deprecated and goes in the next release: pass {new}=",
        DeprecationWarning,
        stacklevel=3,
    )
