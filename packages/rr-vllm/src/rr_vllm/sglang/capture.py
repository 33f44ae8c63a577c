"""Turning capture on for one SGLang request: the ``/generate`` body fields."""

from __future__ import annotations

from typing import Any

from rr_vllm.capture import max_new_tokens
from rr_vllm.engine_config import EngineConfig, check_engine_config, sglang_engine_config
from rr_vllm.errors import CaptureError
from rr_vllm.fields import integer


def sglang_request_fields(
    num_prompt_tokens: int,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int,
    start_len: int = 0,
    continuation: bool = False,
    server_info: Any = None,
) -> dict[str, Any]:
    """Fields of an SGLang ``/generate`` request body that capture routes (the server also
    needs ``--enable-return-routed-experts``); decode with ``start_len``. ``server_info``: the
    server's ``/server_info`` body, ``ServerArgs`` or an :class:`~rr_vllm.EngineConfig`, whose
    configurations that corrupt routes raise :class:`CaptureError` (E7, E8, E9) before any
    request is sent."""
    if server_info is not None:
        if isinstance(server_info, EngineConfig):
            check_engine_config(server_info)
        else:
            sglang_engine_config(server_info)
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
