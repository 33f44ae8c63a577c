"""Turning capture on: engine arguments, per-request sampling fields and SGLang request fields.

Every version-dependent choice comes from :func:`rr_vllm._versions.resolve_flags`; requests that
capture cannot serve exactly are refused here, before anything is generated:

- vLLM < 0.14 (no capture), a hybrid-attention model on vLLM < 0.22 (undersized buffers, E3),
  expert-load-balancing on vLLM < 0.16 (physical ids, E2), 0.32+ without prefix caching;
- a prompt longer than ``prompt_length``, no room left for one generated token, a
  ``prompt_start`` outside ``0..P``, or one on a version without the knob;
- ``prompt_start == P`` on 0.22-0.29 is sent as ``P - 1`` (G4, :mod:`rr_vllm._prompt_start`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rr_core import RouteMeta
from rr_vllm._errors import CaptureError
from rr_vllm._fields import integer
from rr_vllm._prompt_start import prompt_start_to_send
from rr_vllm._store import routes_store_max_bytes
from rr_vllm._versions import resolve_flags

_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")


def _field(config: Any, keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
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
        for name in ("num_hidden_layers", "num_experts", "top_k"):
            integer(getattr(self, name), f"ModelGeometry.{name}", error=CaptureError)
        if min(self.num_hidden_layers, self.num_experts, self.top_k) < 1:
            raise CaptureError(f"layers, experts and top_k must be >= 1; got {self}")
        if self.top_k > self.num_experts:
            raise CaptureError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")

    @property
    def route_bytes_per_token(self) -> int:
        """Bytes of one token's row as vLLM 0.22+ stores it (uint8 up to 256 experts, else
        uint16)."""
        return self.num_hidden_layers * self.top_k * (1 if self.num_experts <= 256 else 2)

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelGeometry:
        """From a Hugging Face config (object or dict; a multimodal config's ``text_config``
        is used when present). ``layer_types`` with more than one kind means hybrid."""
        text = config.get("text_config") if isinstance(config, Mapping) else None
        text = text if text is not None else getattr(config, "text_config", None) or config
        kinds = text.get("layer_types") if isinstance(text, Mapping) else None
        kinds = kinds if kinds is not None else getattr(text, "layer_types", None)
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


def vllm_engine_args(
    geometry: ModelGeometry,
    *,
    vllm_version: str | None = None,
    enable_prefix_caching: bool | None = None,
    enable_eplb: bool = False,
    max_cached_tokens: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``LLM(...)`` / ``AsyncEngineArgs`` that turn capture on.

    ``vllm_version`` defaults to the installed one (read from metadata, vllm is not imported).
    On 0.32+ capture goes through ``aux_output_config`` and prefix caching is switched on;
    ``max_cached_tokens`` (the KV cache's capacity in tokens, as vLLM logs it) sets its
    ``max_bytes`` from the model geometry, otherwise vLLM derives it.
    """
    flags = resolve_flags(vllm_version)
    if geometry.hybrid_attention and not flags.hybrid_attention:
        raise CaptureError(
            f"vLLM {flags.version} sizes the routed-experts buffers wrongly for hybrid-attention "
            "models (several KV-cache groups; E3); capture on this model needs vLLM >= 0.22; "
            "see `rr explain E3`"
        )
    if enable_eplb and not flags.logical_ids:
        raise CaptureError(
            f"vLLM {flags.version} returns physical expert ids under expert-load-balancing "
            "(E2); turn EPLB off or use vLLM >= 0.16, which returns logical ids; see "
            "`rr explain E2`"
        )
    if not flags.aux_output_store:
        return {"enable_return_routed_experts": True}
    if enable_prefix_caching is False:
        raise CaptureError(
            f"vLLM {flags.version} (0.32+) captures routes through the aux-output store, which "
            "requires prefix caching; got enable_prefix_caching=False: leave it on"
        )
    aux: dict[str, Any] = {"enable_return_routed_experts": True}
    if max_cached_tokens is not None:
        aux["max_bytes"] = routes_store_max_bytes(geometry, max_cached_tokens)
    return {"enable_prefix_caching": True, "aux_output_config": aux}


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
    for name, value in (
        ("prompt_length", prompt_length),
        ("response_length", response_length),
        ("max_model_len", max_model_len),
    ):
        integer(value, name, error=CaptureError)
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


def vllm_sampling_fields(
    num_prompt_tokens: int,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int,
    prompt_start: int = 0,
    continuation: bool = False,
    vllm_version: str | None = None,
) -> dict[str, int]:
    """``SamplingParams`` fields of one request: ``max_tokens`` (see :func:`max_new_tokens`)
    and, from 0.22, ``routed_experts_prompt_start`` (skip the first ``prompt_start`` rows).
    Decode with the value sent, ``fields["routed_experts_prompt_start"]``: on 0.22-0.29 a
    ``prompt_start`` of P is sent as P - 1, since P kills their EngineCore (G4, vLLM #55750;
    :func:`~rr_vllm.drop_rows_before` drops the extra row if it is not wanted)."""
    flags = resolve_flags(vllm_version)
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=CaptureError)
    prompt_start = integer(prompt_start, "prompt_start", error=CaptureError, minimum=None)
    fields = {
        "max_tokens": max_new_tokens(
            p,
            prompt_length=prompt_length,
            response_length=response_length,
            max_model_len=max_model_len,
            continuation=continuation,
        )
    }
    sent = prompt_start_to_send(prompt_start, p, flags)
    if flags.prompt_start:
        fields["routed_experts_prompt_start"] = sent
    return fields


def sglang_request_fields(
    num_prompt_tokens: int,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int,
    start_len: int = 0,
    continuation: bool = False,
) -> dict[str, Any]:
    """Fields of an SGLang ``/generate`` request body that capture routes (the server also
    needs ``--enable-return-routed-experts``); decode with ``start_len``."""
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=CaptureError)
    start_len = integer(start_len, "start_len", error=CaptureError, minimum=None)
    limit = max_new_tokens(
        p,
        prompt_length=prompt_length,
        response_length=response_length,
        max_model_len=max_model_len,
        continuation=continuation,
    )
    if not 0 <= start_len <= p:
        raise CaptureError(f"start_len={start_len} is outside 0..P={p}")
    body: dict[str, Any] = {"return_routed_experts": True, "sampling_params": {}}
    body["sampling_params"]["max_new_tokens"] = limit
    if start_len:
        body["routed_experts_start_len"] = start_len
    return body
