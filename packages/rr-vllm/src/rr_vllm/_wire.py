"""Routes on the wire: vLLM's HTTP answer (base64 of a ``.npy`` file per choice) and SGLang's
``meta_info`` (base64 of raw int32, no header).

Shape legend as in :mod:`rr_vllm._decode`. vLLM 0.21's HTTP choice carries only the ``G - 1``
generation rows (int16, MoE layers only; the prompt rows are in ``RequestOutput`` offline, not in
the answer), so its prompt cannot be replayed: it is refused unless ``generation_only=True``, which
keeps the response rows and leaves the prompt rows invalid (routed natively). Only 0.21 ships
int16, so the dtype tells the era even without ``vllm_version``.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rr_core import RouteMeta
from rr_vllm._decode import (
    AbortPolicy,
    IntArray,
    SampleRoutes,
    as_rows,
    check_policy,
    decode_routes_array,
    place_rows,
)
from rr_vllm._errors import EngineOutputError
from rr_vllm._store import check_error_body
from rr_vllm._validate import is_aborted
from rr_vllm._versions import vllm_flags


def npy_base64_to_array(text: str) -> IntArray:
    """vLLM's HTTP routes string (base64 of a ``.npy`` file) as an array, without pickles."""
    if not isinstance(text, str | bytes):
        raise EngineOutputError(f"routed_experts must be a base64 string; got {type(text)}")
    try:
        raw = base64.b64decode(text, validate=True)
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (binascii.Error, ValueError, EOFError, OSError) as e:
        raise EngineOutputError(
            f"routed_experts is not the base64 of a .npy file ({type(e).__name__}: {e}); got "
            f"{len(text)} characters starting {text[:16]!r}: a truncated or altered response?"
        ) from e
    if not isinstance(array, np.ndarray):
        raise EngineOutputError(f"routed_experts decoded to {type(array).__name__}, not an array")
    return as_rows(array, "routed_experts (.npy)")


def _generation_only(
    routes: IntArray,
    meta: RouteMeta,
    *,
    p: int,
    g: int,
    reason: str | None,
    allowed: bool,
    what: str,
) -> SampleRoutes:
    if not allowed:
        raise EngineOutputError(
            f"{what}: a vLLM 0.21 answer (int16 routes, shape {routes.shape}) carries only the "
            f"{g - 1} generation rows; the routes of the {p} prompt tokens are not in the HTTP "
            "answer, so the prompt cannot be replayed. Use vLLM >= 0.22, the offline API "
            "(RequestOutput.prompt_routed_experts), or pass generation_only=True to replay the "
            "response alone (prompt rows invalid, routed natively)"
        )
    return place_rows(
        [routes],
        meta,
        moe_only=True,
        num_prompt_tokens=p,
        num_tokens=p + g,
        prompt_start=p,
        finish_reason=reason,
        what=what,
    )


def decode_vllm_http(
    response: Mapping[str, Any],
    meta: RouteMeta,
    *,
    prompt_token_ids: Sequence[int] | None = None,
    prompt_start: int = 0,
    on_abort: AbortPolicy = "mask",
    vllm_version: str | None = None,
    generation_only: bool = False,
) -> list[SampleRoutes | None]:
    """Routes of each choice of a non-streaming ``/v1/completions`` JSON answer. Token counts
    come from the choice's ``prompt_token_ids`` / ``token_ids`` (``return_token_ids``), or
    ``prompt_token_ids`` here. An error body raises (a 0.32+ store eviction as
    :class:`~rr_vllm.RouteStoreEvictedError`); 0.21 answers need ``generation_only=True``."""
    check_policy(on_abort)
    check_error_body(response)
    split = vllm_version is not None and vllm_flags(vllm_version).split_arrays
    out: list[SampleRoutes | None] = []
    for i, choice in enumerate(response.get("choices", ())):
        what = f"response {response.get('id', '?')}, choice {choice.get('index', i)}"
        prompt = choice.get("prompt_token_ids", prompt_token_ids)
        tokens = choice.get("token_ids")
        if prompt is None or tokens is None:
            raise EngineOutputError(
                f"{what}: needs prompt_token_ids and token_ids to place the routes; send the "
                "request with return_token_ids=true or pass prompt_token_ids"
            )
        text = choice.get("routed_experts")
        reason = choice.get("finish_reason")
        routes = None if text is None or is_aborted(reason) else npy_base64_to_array(text)
        if routes is not None and (split or routes.dtype == np.int16):
            if prompt_start:
                raise EngineOutputError(f"{what}: vLLM 0.21 has no prompt_start; pass 0")
            out.append(
                _generation_only(
                    routes,
                    meta,
                    p=len(prompt),
                    g=len(tokens),
                    reason=reason,
                    allowed=generation_only,
                    what=what,
                )
            )
            continue
        out.append(
            decode_routes_array(
                routes,
                meta,
                num_prompt_tokens=len(prompt),
                num_generated_tokens=len(tokens),
                prompt_start=prompt_start,
                finish_reason=reason,
                on_abort=on_abort,
                what=what,
            )
        )
    return out


def sglang_base64_to_array(text: str, num_layers: int, top_k: int) -> IntArray:
    """SGLang's routes string (base64 of raw little-endian int32, no header) as a read-only
    ``[N, num_layers, top_k]`` view."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise EngineOutputError(f"meta_info['routed_experts'] is not valid base64: {e}") from e
    row = 4 * num_layers * top_k
    if len(raw) % row:
        raise EngineOutputError(
            f"meta_info['routed_experts'] holds {len(raw)} bytes, not a multiple of "
            f"4 * num_hidden_layers * top_k = 4 * {num_layers} * {top_k} = {row}; the model "
            "config does not match the server's, or the string was truncated"
        )
    return np.frombuffer(raw, dtype="<i4").reshape(-1, num_layers, top_k)


def decode_sglang(
    response: Mapping[str, Any],
    meta: RouteMeta,
    *,
    start_len: int = 0,
    on_abort: AbortPolicy = "mask",
) -> SampleRoutes | None:
    """Routes of an SGLang ``/generate`` answer (or its ``meta_info``) sent with
    ``return_routed_experts``; ``start_len`` is the request's ``routed_experts_start_len``."""
    info = response.get("meta_info", response)
    finish = info.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, Mapping) else finish
    text = info.get("routed_experts")
    what = f"SGLang request {info.get('id', '?')}"
    routes = None
    if text is not None and not is_aborted(reason):
        routes = sglang_base64_to_array(text, len(meta.layer_numbers), meta.top_k)
    return decode_routes_array(
        routes,
        meta,
        num_prompt_tokens=int(info["prompt_tokens"]),
        num_generated_tokens=int(info["completion_tokens"]),
        prompt_start=start_len,
        finish_reason=reason,
        on_abort=on_abort,
        what=what,
    )
