"""What capture needs on every engine: the model's geometry and the generation budget that keeps
a sample within the trainer's lengths. The engine-specific fields are in each engine's
``capture`` module."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rr_core import RouteMeta
from rr_core.checks import check_flag, check_instance
from rr_vllm.errors import CaptureError
from rr_vllm.fields import integer

_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")


def _optional(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _text_config(config: Any) -> Any:
    text = config.get("text_config") if isinstance(config, Mapping) else None
    return text if text is not None else getattr(config, "text_config", None) or config


def _field(config: Any, keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        value = _optional(config, key)
        if value is not None:
            return integer(value, f"the model config's {key}", error=CaptureError, minimum=1)
    raise CaptureError(f"the model config has no {what} (looked for {', '.join(keys)})")


@dataclass(frozen=True, kw_only=True)
class ModelGeometry:
    """What capture needs to know of the model: layers on vLLM's axis (every decoder layer),
    expert count, top-k, and whether attention is hybrid (several KV-cache groups, e.g. Gated
    DeltaNet plus full attention)."""

    num_hidden_layers: int
    num_experts: int
    top_k: int
    hybrid_attention: bool = False

    def __post_init__(self) -> None:
        for name in ("num_hidden_layers", "num_experts", "top_k"):  # numpy / torch scalars too
            n = integer(getattr(self, name), f"ModelGeometry.{name}", error=CaptureError)
            object.__setattr__(self, name, n)
        if min(self.num_hidden_layers, self.num_experts, self.top_k) < 1:
            raise CaptureError(f"layers, experts and top_k must be >= 1; got {self}")
        if self.top_k > self.num_experts:
            raise CaptureError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        check_flag(self.hybrid_attention, "ModelGeometry.hybrid_attention", CaptureError)

    @property
    def route_bytes_per_token(self) -> int:
        """Bytes of one token's row as vLLM 0.22+ stores it (uint8 up to 256 experts, else
        uint16)."""
        return self.num_hidden_layers * self.top_k * (1 if self.num_experts <= 256 else 2)

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelGeometry:
        """From a Hugging Face config (object or dict; a multimodal config's ``text_config``
        is used when present). ``layer_types`` with more than one kind means hybrid."""
        text = _text_config(config)
        kinds = _optional(text, "layer_types")
        return cls(
            num_hidden_layers=_field(text, ("num_hidden_layers",), "num_hidden_layers"),
            num_experts=_field(text, _EXPERT_KEYS, "expert count"),
            top_k=_field(text, _TOPK_KEYS, "top-k"),
            hybrid_attention=len(set(kinds or ())) > 1,
        )

    @classmethod
    def from_meta(cls, meta: RouteMeta, *, hybrid_attention: bool = False) -> ModelGeometry:
        """From an ``all_layers`` :class:`~rr_core.RouteMeta` (the axis vLLM returns)."""
        if meta.layer_axis != "all_layers":
            raise CaptureError(
                f"vLLM returns every decoder layer; the meta is on {meta.layer_axis!r}, use an "
                "all_layers meta"
            )
        return cls(
            num_hidden_layers=len(meta.layer_numbers),
            num_experts=meta.num_experts,
            top_k=meta.top_k,
            hybrid_attention=hybrid_attention,
        )


def _layers_listed(config: Any, key: str, layers: int) -> set[int] | None:
    value = _optional(config, key)
    if value is None:
        return None
    zero_d = getattr(value, "ndim", None) == 0  # a 0-d array or tensor is Iterable, not iterable
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable) or zero_d:
        raise CaptureError(
            f"the model config's {key} must be a list of 0-based layer indices; got "
            f"{type(value).__name__}" + (" of no dimension" if zero_d else "")
        )
    what = f"the model config's {key}"
    return {integer(i, what, error=CaptureError, maximum=layers - 1) for i in value}


def _step(config: Any, key: str, default: int, minimum: int) -> int:
    value = _optional(config, key)
    if value is None:
        return default
    return integer(value, f"the model config's {key}", error=CaptureError, minimum=minimum)


def moe_layer_numbers(config: Any) -> tuple[int, ...]:
    """The 1-based decoder layers of a Hugging Face config (object or dict) that route to
    experts, by the rule each family's modelling code applies: ``moe_layers`` (an explicit
    0-based list), else ``mlp_only_layers`` and ``decoder_sparse_step`` (Qwen2-MoE, Qwen3-MoE,
    Qwen3-Next) with ``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek-V2/V3,
    GLM-4-MoE, Kimi); every layer where none is set (Mixtral, OLMoE, GPT-OSS)."""
    text = _text_config(config)
    layers = _field(text, ("num_hidden_layers",), "num_hidden_layers")
    found = _layers_listed(text, "moe_layers", layers)
    if found is None:
        dense = _layers_listed(text, "mlp_only_layers", layers) or set()
        step = _step(text, "decoder_sparse_step", 1, 1)
        first = _step(text, "first_k_dense_replace", 0, 0)
        freq = _step(text, "moe_layer_freq", 1, 1)
        found = {
            i
            for i in range(first, layers)
            if i not in dense and (i + 1) % step == 0 and i % freq == 0
        }
    if not found:
        raise CaptureError(f"the model config leaves none of its {layers} decoder layers MoE")
    return tuple(i + 1 for i in sorted(found))


def route_meta_of(config: Any) -> RouteMeta:
    """The :class:`~rr_core.RouteMeta` of what vLLM and SGLang return for a model with this
    Hugging Face config (object or dict): every decoder layer on the ``all_layers`` axis, the
    dense ones (:func:`moe_layer_numbers`) holding no route."""
    geometry = ModelGeometry.from_hf_config(config)
    return RouteMeta(
        num_experts=geometry.num_experts,
        top_k=geometry.top_k,
        layer_axis="all_layers",
        layer_numbers=tuple(range(1, geometry.num_hidden_layers + 1)),
        moe_layer_numbers=moe_layer_numbers(config),
    )


def check_geometry(value: object, where: str) -> ModelGeometry:
    """``value`` if it is a :class:`ModelGeometry`, else :class:`~rr_vllm.CaptureError`."""
    how = "ModelGeometry.from_hf_config(config)"
    return check_instance(
        value, ModelGeometry, CaptureError, f"{where} takes a ModelGeometry ({how})"
    )


def max_new_tokens(
    num_prompt_tokens: int,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int,
    continuation: bool = False,
) -> int:
    """``min(response_length, prompt_length + response_length - P)`` clamped to
    ``[1, max_model_len - P]``. A first-turn prompt longer than ``prompt_length`` is refused;
    a ``continuation`` (later turn or resumed attempt, whose context holds earlier responses)
    may be longer, but must leave room for one token of the response budget."""
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=CaptureError)
    prompt_length, response_length, max_model_len = (
        integer(value, name, error=CaptureError, minimum=None)
        for name, value in (
            ("prompt_length", prompt_length),
            ("response_length", response_length),
            ("max_model_len", max_model_len),
        )
    )
    check_flag(continuation, "continuation", CaptureError)
    if min(prompt_length, response_length, max_model_len) < 1 or p < 0:
        raise CaptureError(
            f"need prompt_length, response_length, max_model_len >= 1 and P >= 0; got "
            f"{prompt_length}, {response_length}, {max_model_len}, P={p}"
        )
    if p > prompt_length and not continuation:
        raise CaptureError(
            f"the prompt has {p} tokens, more than prompt_length={prompt_length}: truncate or "
            "filter it before generation (a negative offset would misplace every route row)"
        )
    budget = min(response_length, prompt_length + response_length - p)
    room = max_model_len - p
    if budget < 1 or room < 1:
        raise CaptureError(
            f"no room to generate: P={p}, prompt_length={prompt_length}, response_length="
            f"{response_length}, max_model_len={max_model_len} leave {min(budget, room)} tokens"
        )
    return min(budget, room)
