"""SGLang's routes: ``meta_info["routed_experts"]`` of ``/generate`` and ``Engine.generate``
(also the last chunk of a streamed ``/generate``), and the OpenAI-compatible answers' ``sglext``.

Every release sends base64 of the int32 ``[seqlen - 1 - start_len, L, K]`` tensor's raw bytes (no
header); what moved between releases is in :data:`rr_vllm._supported.SGLANG_FEATURES`. Shape
legend as in :mod:`rr_vllm.samples`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from rr_core import RouteMeta, expected_route_rows
from rr_vllm.decoded import DecodedRoutes, decoded, decoded_one
from rr_vllm.error_body import check_error_body
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import as_mapping, count, integer, key
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve, warn_renamed
from rr_vllm.releases import SglangFlags, sglang_flags
from rr_vllm.samples import IntArray, SampleRoutes, as_rows, decode_rows, sample_of


def _b64(text: Any) -> bytes:
    if not isinstance(text, str | bytes):
        raise EngineOutputError(
            f"meta_info['routed_experts'] must be a base64 string; got {type(text).__name__}"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise EngineOutputError(f"meta_info['routed_experts'] is not valid base64: {e}") from e


def _int32_rows(raw: bytes, num_layers: int, top_k: int, dtype: str = "int32") -> IntArray:
    wire = np.dtype(WIRE_DTYPES[dtype])
    row = wire.itemsize * num_layers * top_k
    if len(raw) % row:
        raise EngineOutputError(
            f"meta_info['routed_experts'] holds {len(raw)} bytes, not a multiple of "
            f"{wire.itemsize} ({dtype}) * num_hidden_layers * top_k = {wire.itemsize} * "
            f"{num_layers} * {top_k} = {row}; the model config does not match the server's, or "
            "the string was truncated"
        )
    return np.frombuffer(raw, dtype=wire).reshape(-1, num_layers, top_k)


#: The id dtypes a ``routed_experts_dtype`` field may name (sglang PR #31219, open: narrow ids
#: beside the int32 every release sends), little-endian as the tensor's bytes are.
WIRE_DTYPES = {"int32": "<i4", "uint8": "u1", "uint16": "<u2", "int16": "<i2"}


def wire_dtype(info: Mapping[str, Any], what: str) -> str | None:
    """``meta_info['routed_experts_dtype']`` where the server sends one (None: int32, as every
    released version sends); a name outside :data:`WIRE_DTYPES` raises."""
    name = info.get("routed_experts_dtype")
    if name is None:
        return None
    if not isinstance(name, str) or name.removeprefix("torch.") not in WIRE_DTYPES:
        raise EngineOutputError(
            f"{what}: meta_info['routed_experts_dtype'] is {name!r}; rr reads "
            f"{', '.join(WIRE_DTYPES)}: upgrade rr-vllm, or start the server without narrow ids"
        )
    return name.removeprefix("torch.")


def sglang_base64_to_array(text: str, num_layers: int, top_k: int) -> IntArray:
    """SGLang's routes string (base64 of raw little-endian int32, no header) as a read-only
    ``[N, num_layers, top_k]`` view."""
    # a layer or top-k count past 2**16 is no model's (and would overflow the row size)
    layers = integer(num_layers, "num_layers", minimum=1, maximum=2**16)
    k = integer(top_k, "top_k", minimum=1, maximum=2**16)
    return _int32_rows(_b64(text), layers, k)


def _check_item_size(nbytes: int, want: int, meta: RouteMeta, what: str) -> None:
    """SGLang sends int32 alone: a byte count that fits ``want`` rows of another integer size
    is a re-encoding between the server and here, named; any other count is left to the
    length and row-count checks."""
    L, K = len(meta.layer_numbers), meta.top_k
    for size, dtype in ((8, "int64"), (2, "int16"), (1, "uint8")):
        if want and nbytes != 4 * want * L * K and nbytes == size * want * L * K:
            raise EngineOutputError(
                f"{what}: meta_info['routed_experts'] holds {nbytes} bytes: {want} rows of "
                f"[{L}, {K}] {dtype}, where SGLang sends int32 ({4 * want * L * K} bytes); "
                "something between the server and here re-encoded the ids: decode them as it "
                "wrote them, or read SGLang's answer directly"
            )


def _flags(version: str | None) -> SglangFlags | None:
    return None if version is None else sglang_flags(version)


#: The options SGLang's decoders read.
READS = frozenset(
    {"prompt_start", "start_len", "on_abort", "sglang_version", "engine_version", "engine_config"}
)


def _decode_info(
    info: Mapping[str, Any],
    options: DecodeOptions,
    *,
    what: str,
    missing: str = "",
    final: bool = False,
) -> SampleRoutes | None:
    finish = info.get("finish_reason")
    p = count(key(info, "prompt_tokens", f"{what}: meta_info"), f"{what}: prompt_tokens")
    g = count(key(info, "completion_tokens", f"{what}: meta_info"), f"{what}: completion_tokens")
    sample = sample_of(
        what,
        p,
        g,
        prompt_start=options.prompt_start,
        finish_reason=finish.get("type") if isinstance(finish, Mapping) else finish,
    )
    start = sample.prompt_start
    if start > p:
        raise EngineOutputError(
            f"{what}: routed_experts_start_len={start} is beyond the prompt's {p} tokens; SGLang "
            "takes 0..prompt_tokens (0.5.12+ aborts such a request, older releases ignore it); "
            "send a start_len within the prompt"
        )
    text = info.get("routed_experts")
    routes = None
    if text is None and sample.finish_reason is None and not final:
        raise EngineOutputError(
            f"{what}: no finish_reason and no routed_experts: a streamed chunk before the last "
            "one; SGLang sends the routes on the final chunk only"
        )
    if text is not None and not sample.aborted:
        full = expected_route_rows(sample.num_tokens)
        # 0.5.8-0.5.11 ignore routed_experts_start_len: their rows start at 0 whatever was
        # sent. Rows [0, start) are then dropped, so every release gives the same sample.
        flags = _flags(options.engine_version)
        honoured = None if flags is None else flags.start_len
        dtype = wire_dtype(info, what)
        if isinstance(text, str | bytes):
            raw = _b64(text)
            L, K = options.layer_slots, options.top_k
            whole = start and honoured is not True and len(raw) == 4 * full * L * K
            if dtype is None and not whole:  # a narrow field says what the bytes are
                want = expected_route_rows(sample.num_tokens, prompt_start=start)
                _check_item_size(len(raw), full if honoured is False else want, options.meta, what)
            routes = _int32_rows(raw, L, K, dtype or "int32")
        else:  # 0.5.7-0.5.9 Engine with skip_tokenizer_init: the int32 tensor itself
            routes = as_rows(text, f"{what}: meta_info['routed_experts']")
        if start and honoured is not True and routes.shape[0] == full:
            routes = routes[start:]
    elif text is None and not sample.aborted and missing:
        raise EngineOutputError(f"{what}: {missing} (D3); see `rr explain D3`")
    return decode_rows(routes, sample, options)


def decode_sglang(
    response: Mapping[str, Any],
    options: RouteMeta | DecodeOptions,
    /,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of an SGLang ``/generate`` answer, ``Engine.generate`` result or final streamed
    chunk (or its ``meta_info``) sent with ``return_routed_experts``. Options: ``start_len``
    (the request's ``routed_experts_start_len``; ``prompt_start`` in :class:`DecodeOptions`),
    ``on_abort``, ``sglang_version``, which tells a release that ignores ``start_len``
    (0.5.8-0.5.11); without it the row count does. One sample (``.only()``); the deprecated
    form (a RouteMeta, option keywords) returns the sample itself."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_sglang")
    body = as_mapping(response, "the SGLang response")
    check_error_body(body)
    info = as_mapping(body.get("meta_info", body), "the SGLang response's meta_info")
    sample = _decode_info(info, opts, what=f"SGLang request {info.get('id', '?')}")
    return decoded_one(sample, opts, legacy)


_OPENAI_MISSING = (
    "the OpenAI answer has no sglext.routed_experts; send return_routed_experts=true in the "
    "request body and start the server with --enable-return-routed-experts (SGLang 0.5.9+; "
    "0.5.7-0.5.8 OpenAI answers carry no routes: use /generate)"
)
_FIRST_ONLY = (
    "SGLang's sglext carries the routes of the first choice only (process_routed_experts_from_"
    "ret(ret[0]) in serving_chat.py / serving_completions.py); send n=1, or chat with "
    "return_meta_info=true (0.5.13+, routes per choice), or /generate"
)


def facts(
    decoder: str,
    num_prompt_tokens: int | None,
    num_generated_tokens: int | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> tuple[int | None, int | None]:
    """The token counts a caller passed, under their names or SGLang's (deprecated)."""
    if prompt_tokens is not None:
        warn_renamed(decoder, "prompt_tokens", "num_prompt_tokens")
        num_prompt_tokens = prompt_tokens if num_prompt_tokens is None else num_prompt_tokens
    if completion_tokens is not None:
        warn_renamed(decoder, "completion_tokens", "num_generated_tokens")
        if num_generated_tokens is None:
            num_generated_tokens = completion_tokens
    return num_prompt_tokens, num_generated_tokens


def _usage_info(
    usage: Any,
    given: tuple[int | None, int | None],
    what: str,
    *,
    finish_reason: Any,
    routed_experts: Any,
    routed_experts_dtype: Any,
) -> dict[str, Any]:
    """An OpenAI answer's routes (``sglext``) as a ``meta_info`` for :func:`_decode_info`: the
    token counts passed (``given``: P, G), or else ``usage``'s."""
    p, g = given
    if p is None or g is None:
        if not isinstance(usage, Mapping):
            raise EngineOutputError(
                f"{what}: no usage to count the tokens by; send stream_options={{'include_usage': "
                "true} when streaming, or pass num_prompt_tokens and num_generated_tokens"
            )
        p = usage.get("prompt_tokens") if p is None else p
        g = usage.get("completion_tokens") if g is None else g
    return {
        "prompt_tokens": p,
        "completion_tokens": g,
        "finish_reason": finish_reason,
        "routed_experts": routed_experts,
        "routed_experts_dtype": routed_experts_dtype,
    }


def _choices(body: Mapping[str, Any], what: str) -> Sequence[Any]:
    choices = key(body, "choices", f"{what} (an OpenAI-compatible answer)")
    if isinstance(choices, str | bytes | Mapping) or not isinstance(choices, Sequence):
        raise EngineOutputError(
            f"{what}: 'choices' must be a list of choice objects; got {type(choices).__name__}"
        )
    return choices


def decode_sglang_openai(
    response: Mapping[str, Any],
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int | None = None,
    num_generated_tokens: int | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of each choice of a non-streaming SGLang ``/v1/completions`` or
    ``/v1/chat/completions`` answer: the response-level ``sglext.routed_experts`` (n=1, token
    counts from ``usage`` unless passed as ``num_prompt_tokens`` / ``num_generated_tokens``;
    SGLang's names ``prompt_tokens`` / ``completion_tokens`` are deprecated), or each choice's
    ``meta_info`` (chat with ``return_meta_info``). An n>1 answer without per-choice
    ``meta_info`` is refused: sglext holds the first choice's routes alone. Options as
    :func:`decode_sglang`'s."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_sglang_openai")
    p_given, g_given = facts(
        "decode_sglang_openai",
        num_prompt_tokens,
        num_generated_tokens,
        prompt_tokens,
        completion_tokens,
    )
    body = as_mapping(response, "the SGLang OpenAI response")
    check_error_body(body)
    what = f"SGLang response {body.get('id', '?')}"
    choices = [as_mapping(c, f"{what}, choice {i}") for i, c in enumerate(_choices(body, what))]
    if not choices:
        raise EngineOutputError(f"{what}: 'choices' is empty; a completion has n >= 1 choices")
    if all(isinstance(c.get("meta_info"), Mapping) for c in choices):
        samples = [
            _decode_info(
                c["meta_info"],
                opts,
                what=f"{what}, choice {c.get('index', i)}",
                missing=_OPENAI_MISSING,
                final=True,
            )
            for i, c in enumerate(choices)
        ]
        return decoded(samples, opts, legacy)
    if len(choices) > 1:
        raise EngineOutputError(f"{what}: {len(choices)} choices; {_FIRST_ONLY}")
    ext = body.get("sglext")
    ext = as_mapping(ext, f"{what}: sglext") if ext is not None else {}
    info = _usage_info(
        body.get("usage"),
        (p_given, g_given),
        what,
        finish_reason=choices[0].get("finish_reason"),
        routed_experts=ext.get("routed_experts"),
        routed_experts_dtype=ext.get("routed_experts_dtype"),
    )
    sample = _decode_info(
        info,
        opts,
        what=f"{what}, choice {choices[0].get('index', 0)}",
        missing=_OPENAI_MISSING,
        final=True,
    )
    return decoded([sample], opts, legacy)
