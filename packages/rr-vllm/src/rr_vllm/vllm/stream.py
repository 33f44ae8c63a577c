"""Routes of a streamed answer: vLLM's ``/inference/v1/generate`` with ``stream=true`` (G5).

The stream is server-sent events, one ``data: {json}`` per chunk, then ``data: [DONE]``. Each
chunk's ``choices[i]`` holds the ``token_ids`` generated since the previous chunk; the engine
returns routes only when a request finishes, so ``routed_experts`` (base64 of a ``.npy`` file,
the whole request's ``P+G-1-prompt_start`` rows, as in the non-streaming answer) rides on the
chunk that carries ``finish_reason`` and is null on every other chunk (vLLM PR #44638, from
0.24.0; ``vllm/entrypoints/scale_out/token_in_token_out/serving.py`` of 0.33.0).
``prompt_token_ids`` comes once, on the first chunk, when the request set ``return_token_ids``;
a usage-only chunk (``choices: []``) may close the stream.

The OpenAI streaming answers (``/v1/completions``, ``/v1/chat/completions`` with
``stream=true``) drop the routes: their stream choices have no ``routed_experts`` field
(vLLM RFC #56745, open). They are refused by name, as is a finished choice whose final chunk
carries no routes: never an empty route set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from rr_core import RouteMeta, expected_route_rows
from rr_vllm.decoded import DecodedRoutes, decoded
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import as_mapping, count, integers, reason, token_count
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve, warn_renamed
from rr_vllm.releases import vllm_flags
from rr_vllm.samples import Sample, SampleRoutes, decode_rows
from rr_vllm.sse import sse_items
from rr_vllm.vllm.store import check_error_body
from rr_vllm.vllm.wire import DERENDER_HIDES_TOKENS, npy_base64_to_array, prompt_count

_OPENAI_OBJECTS = frozenset({"text_completion", "chat.completion.chunk"})
_FIX = (
    "stream from /inference/v1/generate (vLLM >= 0.24 sends the routes on the final chunk), or "
    "send the OpenAI request with stream=false"
)


@dataclass
class _Choice:
    """One choice gathered over the chunks."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    routed_experts: str | None = None
    finished: bool = False
    sent_token_ids: bool = False


def _events(stream: Iterable[Any]) -> Iterable[tuple[int, Mapping[str, Any] | None]]:
    """``(chunk number, parsed chunk)`` from SSE text (whole, by line, or in byte chunks cut
    anywhere, str or bytes) or already-parsed chunks; None for ``[DONE]``."""
    for n, item in enumerate(sse_items(stream, "a vLLM stream"), start=1):
        if isinstance(item, Mapping):
            yield n, item
            continue
        if item == "[DONE]":
            yield n, None
            continue
        try:
            chunk = json.loads(item)
        except json.JSONDecodeError as e:
            raise EngineOutputError(
                f"stream chunk {n} is not JSON ({e}): {item[:60]!r}; a cut or altered stream"
            ) from e
        yield n, as_mapping(chunk, f"stream chunk {n}")


class _Stream:
    """What the chunks of one stream say, gathered."""

    def __init__(self) -> None:
        self.request_id = "?"
        self.choices: dict[int, _Choice] = {}
        self.prompt_token_ids: list[int] | None = None  # on the first chunk only, for every choice
        self.completion_tokens: int | None = None  # the final usage-only chunk's total
        self.done = False
        self.derender = False  # vLLM 0.34's output_mode="derender": choices carry a delta


def _gather(stream: Iterable[Any]) -> _Stream:
    out = _Stream()
    choices = out.choices
    for n, chunk in _events(stream):
        if out.done:
            raise EngineOutputError(f"stream chunk {n} follows data: [DONE]")
        if chunk is None:
            out.done = True
            continue
        check_error_body(chunk)
        out.request_id = str(chunk.get("request_id", chunk.get("id", out.request_id)))
        what = f"stream {out.request_id}, chunk {n}"
        if chunk.get("object") in _OPENAI_OBJECTS:
            raise EngineOutputError(
                f"{what} is an OpenAI streaming chunk ({chunk.get('object')!r}): vLLM's OpenAI "
                "streaming path drops the routed experts (vLLM RFC #56745; see `rr explain G5`); "
                f"{_FIX}"
            )
        out.derender = out.derender or chunk.get("output_mode") == "derender"
        items = chunk.get("choices", [])
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
            raise EngineOutputError(f"{what}: 'choices' must be a list; got {type(items).__name__}")
        usage = chunk.get("usage")
        if isinstance(usage, Mapping) and not items and "completion_tokens" in usage:
            out.completion_tokens = count(usage["completion_tokens"], f"{what}: usage")
        prompt = chunk.get("prompt_token_ids")
        if prompt is not None and out.prompt_token_ids is None:
            out.prompt_token_ids = integers(prompt, f"{what}: prompt_token_ids")
        for i, item in enumerate(items):
            c = as_mapping(item, f"{what}, choice {i}")
            index = c.get("index", i)
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise EngineOutputError(f"{what}: choice index must be an integer >= 0: {index!r}")
            derender = out.derender and "delta" in c
            if not derender and ("delta" in c or ("text" in c and "routed_experts" not in c)):
                raise EngineOutputError(
                    f"{what}: an OpenAI streaming choice (no routed_experts field): vLLM's OpenAI "
                    "streaming path drops the routed experts (vLLM RFC #56745; "
                    f"see `rr explain G5`); {_FIX}"
                )
            state = choices.setdefault(index, _Choice())
            where = f"{what}, choice {index}"
            if state.finished:
                raise EngineOutputError(f"{where} arrives after the choice's final chunk")
            delta = c.get("token_ids")
            if delta is not None:
                state.token_ids += integers(delta, f"{where}: token_ids")
                state.sent_token_ids = True
            routes = c.get("routed_experts")
            state.finish_reason = reason(c.get("finish_reason"), f"{where}: finish_reason")
            state.finished = state.finish_reason is not None
            if routes is not None:
                if not state.finished:
                    raise EngineOutputError(
                        f"{where} carries routed_experts before the choice finished; vLLM sends "
                        "them once, with finish_reason: a stream of another server?"
                    )
                state.routed_experts = routes
    return out


#: The options :func:`decode_vllm_stream` reads.
READS = frozenset({"prompt_start", "on_abort", "vllm_version", "engine_version", "engine_config"})


def decode_vllm_stream(
    stream: Iterable[Any],
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of each choice of a streamed ``/inference/v1/generate`` answer, in index order.

    ``stream``: the SSE text (whole, line by line, or the byte chunks an HTTP client yields,
    cut anywhere; str or bytes) or the parsed chunks.
    ``num_prompt_tokens``: the prompt's length, unless the first chunk carries its ids
    (``return_token_ids``; the deprecated ``prompt_token_ids=`` counts its ids). Options:
    ``prompt_start`` (the ``routed_experts_prompt_start`` sent), ``on_abort``,
    ``engine_version``. A cut stream (no ``[DONE]``, a choice without
    ``finish_reason``), an OpenAI streaming chunk, or a finished choice without routes raises
    :class:`~rr_vllm.EngineOutputError`.
    """
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_vllm_stream")
    if prompt_token_ids is not None:
        warn_renamed("decode_vllm_stream", "prompt_token_ids", "num_prompt_tokens")
        if num_prompt_tokens is None:
            num_prompt_tokens = token_count(prompt_token_ids, "prompt_token_ids")
    version = opts.engine_version
    if version is not None and not vllm_flags(version).stream_routes:
        raise EngineOutputError(
            f"vLLM {version} streams no routes: /inference/v1/generate's stream choices "
            "carry routed_experts from 0.24.0 (vLLM PR #44638); upgrade, or send stream=false"
        )
    gathered = _gather(stream)
    choices, name = gathered.choices, f"stream {gathered.request_id}"
    prompt: Sequence[int] | None = gathered.prompt_token_ids
    unfinished = sorted(i for i, c in choices.items() if not c.finished)
    if not gathered.done or not choices or unfinished:
        missing = [] if gathered.done else ["no data: [DONE]"]
        missing += [] if choices else ["no choice"]
        missing += [f"choices {unfinished} have no finish_reason"] if unfinished else []
        raise EngineOutputError(
            f"{name} is cut: {', '.join(missing)}; every choice ends with a chunk carrying "
            "finish_reason (and the routes) before [DONE]: read the whole stream, or resubmit"
        )
    hidden = [i for i, c in choices.items() if gathered.derender and not c.sent_token_ids]
    if hidden:
        raise EngineOutputError(f"{name}, choices {hidden}: {DERENDER_HIDES_TOKENS}")
    generated = sum(len(c.token_ids) for c in choices.values())
    if gathered.completion_tokens not in (None, generated):
        raise EngineOutputError(
            f"{name}: the chunks carry {generated} generated tokens, the final usage says "
            f"{gathered.completion_tokens}: chunks were lost; read the whole stream, or resubmit"
        )
    p = prompt_count(prompt, num_prompt_tokens, name, "on the first chunk")
    start = opts.prompt_start
    out: list[SampleRoutes | None] = []
    for index in sorted(choices):
        c = choices[index]
        sample = Sample(f"{name}, choice {index}", p, p + len(c.token_ids), start, c.finish_reason)
        routes = None
        if c.routed_experts is not None and not sample.aborted:
            routes = npy_base64_to_array(c.routed_experts)
            _check_streamed_rows(routes.shape[0], sample)
        elif not sample.aborted:
            raise EngineOutputError(
                f"{sample.what} finished ({c.finish_reason!r}) and its final chunk carries no "
                "routed_experts: the server streams no routes (OpenAI streaming path, vLLM < "
                f"0.24, or capture off: --enable-return-routed-experts); {_FIX}. An empty route "
                "set is never returned"
            )
        out.append(decode_rows(routes, sample, opts))
    return decoded(out, opts, legacy)


def _check_streamed_rows(num_rows: int, sample: Sample) -> None:
    """vLLM streams exactly the rule's rows (rr_core's :func:`~rr_core.expected_route_rows`);
    a route for every token, accepted elsewhere from token 0, here means a lost chunk, and so
    does a start at or past the last token (a finished choice generated one token at least)."""
    p, t, start = sample.num_prompt_tokens, sample.num_tokens, sample.prompt_start
    expected = expected_route_rows(t, prompt_start=min(start, t))
    if num_rows != expected or start >= t:
        raise EngineOutputError(
            f"{sample.what}: {num_rows} route rows for P={p}, G={t - p} tokens and "
            f"prompt_start={start}; vLLM sends P + G - 1 - prompt_start = {expected}: token "
            "chunks were lost or prompt_start is not the one sent"
        )
