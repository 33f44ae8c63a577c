"""A streamed SGLang OpenAI answer: the one chunk with ``choices: []`` and
``sglext.routed_experts`` after the last token, decoded as :mod:`rr_vllm.sglang.wire` does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Unpack

from rr_core import RouteMeta
from rr_vllm.decoded import DecodedRoutes, decoded_one
from rr_vllm.error_body import check_error_body
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import as_mapping, chunks_of
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve
from rr_vllm.sglang.wire import _FIRST_ONLY, READS, _choices, _decode_info, _usage_info, facts


def decode_sglang_stream(
    chunks: Iterable[Mapping[str, Any] | str],
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int | None = None,
    num_generated_tokens: int | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of a streamed SGLang OpenAI answer: ``chunks`` are its ``data:`` lines, each
    parsed with ``json.loads`` (``"[DONE]"`` is skipped). SGLang sends the routes once, in a
    chunk with ``choices: []`` and ``sglext.routed_experts`` after the last token; token counts
    come from the usage chunk (``stream_options.include_usage``) unless passed
    (``num_prompt_tokens``, ``num_generated_tokens``). A stream without that chunk is refused
    (never an empty route set), and so is n>1. Options as :func:`~rr_vllm.decode_sglang`'s; one
    sample (``.only()``)."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_sglang_stream")
    p_given, g_given = facts(
        "decode_sglang_stream",
        num_prompt_tokens,
        num_generated_tokens,
        prompt_tokens,
        completion_tokens,
    )
    config = opts.engine_config
    if config is not None and config.engine == "sglang" and config.prompt_rows_merged:
        # SGLang's PD path splices the prefill replica's rows into non-streamed answers only
        # (sglang #22916): a streamed answer of a decode replica is never merged (D8).
        opts = dataclasses.replace(
            opts, engine_config=dataclasses.replace(config, prompt_rows_merged=False)
        )
    what = "SGLang stream"
    indices: set[Any] = set()
    finish: Any = None
    usage: Any = None
    texts: list[Any] = []
    dtype: Any = None
    for i, item in enumerate(chunks_of(chunks, "an SGLang stream")):
        if isinstance(item, str) and item.strip() == "[DONE]":
            continue
        chunk = as_mapping(item, f"{what}, chunk {i} (json.loads of one data: line)")
        check_error_body(chunk)
        what = f"SGLang stream {chunk.get('id', '?')}"
        for j, c in enumerate(_choices(chunk, f"{what}, chunk {i}")):
            choice = as_mapping(c, f"{what}, chunk {i}, choice {j}")
            indices.add(choice.get("index", 0))
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        ext = chunk.get("sglext")
        if ext is not None and as_mapping(ext, f"{what}: sglext").get("routed_experts") is not None:
            texts.append(ext["routed_experts"])
            dtype = ext.get("routed_experts_dtype", dtype)
    if len(indices) > 1:
        raise EngineOutputError(f"{what}: {len(indices)} choices streamed; {_FIRST_ONLY}")
    if len(texts) > 1:
        raise EngineOutputError(
            f"{what}: {len(texts)} chunks carry sglext.routed_experts; SGLang sends one, after "
            "the last token: two streams mixed?"
        )
    if finish is None and not texts:
        raise EngineOutputError(
            f"{what}: no chunk has a finish_reason: the stream was cut before its end"
        )
    info = _usage_info(
        usage,
        (p_given, g_given),
        what,
        finish_reason=finish,
        routed_experts=texts[0] if texts else None,
        routed_experts_dtype=dtype,
    )
    sample = _decode_info(
        info,
        opts,
        what=what,
        missing=(
            "the stream has no chunk with sglext.routed_experts; SGLang 0.5.9+ sends one with "
            "choices=[] after the last token when the request has return_routed_experts=true "
            "and the server --enable-return-routed-experts"
        ),
        final=True,
    )
    return decoded_one(sample, opts, legacy)
