"""Turning capture on for vLLM: engine arguments and per-request sampling fields.

Every version-dependent choice comes from :func:`rr_vllm.releases.resolve_flags`; requests
that capture cannot serve exactly are refused here, before anything is generated:

- vLLM < 0.14 (no capture), a hybrid-attention model on vLLM < 0.22 (undersized buffers, E3),
  expert-load-balancing on vLLM < 0.16 (physical ids, E2), 0.32+ without prefix caching;
- a prompt longer than ``prompt_length``, no room left for one generated token, a
  ``prompt_start`` outside ``0..P``, or one on a version without the knob;
- ``prompt_start == P`` on 0.22-0.29 is sent as ``P - 1`` (G4, :mod:`rr_vllm.vllm.prompt_start`).
"""

from __future__ import annotations

from typing import Any

from rr_vllm.capture import ModelGeometry, check_geometry, max_new_tokens
from rr_vllm.engine_config import EngineConfig, check_engine_config
from rr_vllm.errors import CaptureError
from rr_vllm.fields import integer
from rr_vllm.prompt_start import prompt_start_to_send
from rr_vllm.releases import resolve_flags
from rr_vllm.vllm.store import routes_store_max_bytes


def vllm_engine_args(
    geometry: ModelGeometry,
    *,
    vllm_version: str | None = None,
    enable_prefix_caching: bool | None = None,
    enable_eplb: bool = False,
    max_cached_tokens: int | None = None,
    engine_config: EngineConfig | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``LLM(...)`` / ``AsyncEngineArgs`` that turn capture on.

    ``vllm_version`` defaults to the installed one (read from metadata, vllm is not imported).
    On 0.32+ capture goes through ``aux_output_config`` and prefix caching is switched on;
    ``max_cached_tokens`` (the KV cache's capacity in tokens, as vLLM logs it) sets its
    ``max_bytes`` from the model geometry, otherwise vLLM derives it. ``engine_config``: the
    rest of the engine's configuration (:func:`~rr_vllm.vllm_engine_config`), checked by
    :func:`~rr_vllm.check_engine_config`; its ``prefix_caching`` stands in for
    ``enable_prefix_caching`` when that is not given.
    """
    geometry = check_geometry(geometry, "vllm_engine_args")
    flags = resolve_flags(vllm_version)
    if engine_config is not None:
        check_engine_config(engine_config)
        if enable_prefix_caching is None:
            enable_prefix_caching = engine_config.prefix_caching
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
