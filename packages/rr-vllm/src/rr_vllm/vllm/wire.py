"""Routes on the wire: vLLM's HTTP answer (base64 of a ``.npy`` file per choice). SGLang's forms
are in :mod:`rr_vllm.sglang.wire`.

Shape legend as in :mod:`rr_vllm.samples`. vLLM 0.21's HTTP choice carries only the ``G - 1``
generation rows (int16, MoE layers only; the prompt rows are in ``RequestOutput`` offline, not in
the answer), so its prompt cannot be replayed: it is refused unless ``generation_only=True``, which
keeps the response rows and leaves the prompt rows invalid (routed natively). Only 0.21 ships
int16, so the dtype tells the era even without ``vllm_version``.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from rr_core import RouteMeta
from rr_vllm.decoded import DecodedRoutes, decoded
from rr_vllm.engine_sources import answered_by_prefill
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import as_mapping, count, key, reason, token_count
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve, warn_renamed
from rr_vllm.releases import vllm_flags
from rr_vllm.samples import IntArray, Sample, SampleRoutes, as_rows, decode_rows, place_rows
from rr_vllm.vllm.store import check_error_body

_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _npy_rows(raw: bytes, what: str) -> IntArray:
    """A read-only view of a ``.npy`` file's array. The header's declared size is checked
    against the bytes that follow it before anything is allocated (a header claiming shape
    ``(10**18, 3, 2)`` must not ask for exabytes); object dtypes (pickles) are refused."""
    fp = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(fp)
        read_header = _NPY_HEADERS.get(version)
        if read_header is None:
            raise EngineOutputError(
                f"{what}: .npy format version {version[0]}.{version[1]}; vLLM writes 1.0 (2.0 "
                "for huge headers)"
            )
        shape, fortran_order, dtype = read_header(fp)
    except EngineOutputError:
        raise
    except Exception as e:  # numpy tokenizes and evaluates the header text: no fixed error set
        raise EngineOutputError(
            f"{what}: not a .npy file, its header cannot be read ({type(e).__name__}: {e}): a "
            "truncated or altered response?"
        ) from e
    if dtype.kind not in "iu" or len(shape) != 3 or min(shape, default=0) < 0:
        raise EngineOutputError(
            f"{what} must be an integer [rows, layers, top_k] array; the .npy header declares "
            f"dtype {dtype}, shape {shape}"
        )
    items = math.prod(shape)
    body = len(raw) - fp.tell()
    if items * dtype.itemsize != body:
        raise EngineOutputError(
            f"{what}: the .npy header declares shape {shape} of {dtype} ({items * dtype.itemsize}"
            f" bytes), but {body} bytes follow it: a truncated or altered response"
        )
    flat = np.frombuffer(raw, dtype=dtype, count=items, offset=fp.tell())
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)


def npy_base64_to_array(text: str) -> IntArray:
    """vLLM's HTTP routes string (base64 of a ``.npy`` file) as a read-only array, without
    pickles; anything else raises :class:`~rr_vllm.EngineOutputError`."""
    what = "routed_experts (.npy)"
    if not isinstance(text, str | bytes):
        raise EngineOutputError(f"routed_experts must be a base64 string; got {type(text)}")
    try:
        array = _npy_rows(base64.b64decode(text, validate=True), what)
    except (binascii.Error, ValueError, TypeError, SyntaxError, EOFError) as e:
        if isinstance(e, EngineOutputError):
            raise
        raise EngineOutputError(
            f"routed_experts is not the base64 of a .npy file ({type(e).__name__}: {e}); got "
            f"{len(text)} characters starting {text[:16]!r}: a truncated or altered response?"
        ) from e
    return as_rows(array, what)


def _generation_only(routes: IntArray, sample: Sample, options: DecodeOptions) -> SampleRoutes:
    p, g = sample.num_prompt_tokens, sample.num_tokens - sample.num_prompt_tokens
    if not options.generation_only:
        raise EngineOutputError(
            f"{sample.what}: a vLLM 0.21 answer (int16 routes, shape {routes.shape}) carries only "
            f"the {g - 1} generation rows; the routes of the {p} prompt tokens are not in the "
            "HTTP answer, so the prompt cannot be replayed. Use vLLM >= 0.22, the offline API "
            "(RequestOutput.prompt_routed_experts), or pass generation_only=True to replay the "
            "response alone (prompt rows invalid, routed natively)"
        )
    return place_rows([routes], sample._replace(prompt_start=p), options, moe_only=True)


#: vLLM 0.34's /inference/v1/generate ``output_mode="derender"`` with ``include_reasoning=false``
#: hides the choices' token ids (and log-probs) and still sends the routes.
DERENDER_HIDES_TOKENS = (
    "an output_mode='derender' answer without token_ids (vLLM 0.34 hides them, and the "
    "log-probs, when the request sets include_reasoning=false) still carries routed_experts, "
    "whose rows cannot be aligned with tokens that are not sent: send include_reasoning=true, "
    "or output_mode='tokens' (the default)"
)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


#: The options :func:`decode_vllm_http` reads.
READS = frozenset(
    {
        "prompt_start",
        "on_abort",
        "vllm_version",
        "engine_version",
        "generation_only",
        "engine_config",
    }
)


def prompt_count(prompt: Any, num_prompt_tokens: int | None, what: str, where: str) -> int:
    """P of an HTTP or streamed answer: its ``prompt_token_ids`` counted, else the caller's
    ``num_prompt_tokens``; neither raises (``where``: where the ids were looked for)."""
    if prompt is not None:
        return token_count(prompt, f"{what}: prompt_token_ids")
    if num_prompt_tokens is None:
        raise EngineOutputError(
            f"{what}: no prompt_token_ids {where}; send the request with return_token_ids=true "
            "or pass num_prompt_tokens"
        )
    return count(num_prompt_tokens, "num_prompt_tokens")


def decode_vllm_http(
    response: Mapping[str, Any],
    options: RouteMeta | DecodeOptions,
    /,
    *,
    num_prompt_tokens: int | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """Routes of each choice of a non-streaming JSON answer: ``/v1/completions``,
    ``/v1/chat/completions`` or ``/inference/v1/generate``. Token counts come from the choice's
    ``token_ids`` and the prompt's ``prompt_token_ids``: the choice's (completions), the
    response's (chat, generate), or ``num_prompt_tokens`` here (the deprecated
    ``prompt_token_ids=`` counts its ids). The OpenAI answers carry token ids only when the
    request sets ``return_token_ids=true`` (null otherwise, which raises). Options:
    ``prompt_start``, ``on_abort``, ``engine_version``, ``generation_only``. An error body raises
    (a 0.32+ store eviction as :class:`~rr_vllm.RouteStoreEvictedError`); 0.21 answers need
    ``generation_only=True``."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_vllm_http")
    if prompt_token_ids is not None:
        warn_renamed("decode_vllm_http", "prompt_token_ids", "num_prompt_tokens")
        if num_prompt_tokens is None:
            num_prompt_tokens = token_count(prompt_token_ids, "prompt_token_ids")
    body = as_mapping(response, "the HTTP response")
    check_error_body(body)
    version = opts.engine_version
    split = version is not None and vllm_flags(version).split_arrays
    name = f"response {body.get('id', body.get('request_id', '?'))}"
    choices = key(body, "choices", f"{name} (a /v1/completions answer)")
    if isinstance(choices, str | bytes | Mapping) or not isinstance(choices, Sequence):
        raise EngineOutputError(
            f"{name}: 'choices' must be a list of choice objects; got {type(choices).__name__}"
        )
    if not choices:
        raise EngineOutputError(f"{name}: 'choices' is empty; a completion has n >= 1 choices")
    # /v1/chat/completions and /inference/v1/generate send the prompt once, response-level
    top_prompt = body.get("prompt_token_ids")
    prefill = answered_by_prefill(body.get("kv_transfer_params"))  # D8 on a kv_both replica
    out: list[SampleRoutes | None] = []
    for i, item in enumerate(choices):
        choice = as_mapping(item, f"{name}, choice {i}")
        what = f"{name}, choice {choice.get('index', i)}"
        # a null field is an absent one: vLLM sends `"prompt_token_ids": null` in every
        # /v1/completions choice unless return_token_ids is set
        prompt = _first(choice.get("prompt_token_ids"), top_prompt)
        tokens = choice.get("token_ids")
        if tokens is None and body.get("output_mode") == "derender":
            raise EngineOutputError(f"{what}: {DERENDER_HIDES_TOKENS}")
        if tokens is None:
            raise EngineOutputError(
                f"{what}: token_ids is null, so the generated tokens the routes cover are "
                "unknown; vLLM returns them only when the request sets return_token_ids=true "
                "(/v1/completions, /v1/chat/completions; /inference/v1/generate always sends "
                "them). Passing num_prompt_tokens cannot replace them"
            )
        p = prompt_count(prompt, num_prompt_tokens, what, "(in the choice or the response)")
        g = token_count(tokens, f"{what}: token_ids")
        reason_ = reason(choice.get("finish_reason"), f"{what}: finish_reason")
        sample = Sample(what, p, p + g, opts.prompt_start, reason_, prefill)
        text = choice.get("routed_experts")
        routes = None if text is None or sample.aborted else npy_base64_to_array(text)
        if routes is not None and (split or routes.dtype == np.int16):
            if opts.prompt_start:
                raise EngineOutputError(f"{what}: vLLM 0.21 has no prompt_start; pass 0")
            out.append(_generation_only(routes, sample, opts))
        else:
            out.append(decode_rows(routes, sample, opts))
    return decoded(out, opts, legacy)
