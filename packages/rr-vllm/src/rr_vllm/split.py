"""Prefill/decode split deployments: the prefill replica's prompt rows joined with the decode
replica's rows into one sample (D8).

The decode replica receives the prompt's KV cache and never runs the prompt, so its rows of the
prompt tokens hold whatever its buffer held; the prefill replica ran the prompt (and sampled the
first token), so its rows ``[start, P)`` are the prompt's routes. The joined sample takes tokens
``[0, P)`` from the prefill replica and ``[P, T)`` from the decode replica, as vLLM's router
splices ``prefill[0:P] + decode[P:]``.
"""

from __future__ import annotations

import numpy as np

from rr_core.checks import check_instance
from rr_vllm.errors import EngineOutputError
from rr_vllm.samples import SampleRoutes


def _name(sample: object, role: str) -> SampleRoutes:
    takes = f"merge_split_routes: the {role} replica's routes must be a SampleRoutes"
    return check_instance(sample, SampleRoutes, EngineOutputError, takes + " (decode it first)")


def _check_sides(prefill: SampleRoutes, decode: SampleRoutes, p: int) -> None:
    """Each sample is recognisable as the side it is passed as: the prefill replica's has rows
    before the prompt length, and it stops by the decode replica's last token (it samples one
    token, the decode replica goes on). Samples swapped would merge into rows of nothing."""
    swapped = "; were the samples swapped? The order is merge_split_routes(prefill, decode)"
    if p and prefill.prompt_start >= p:
        raise EngineOutputError(
            f"merge_split_routes: the sample passed as prefill has no prompt rows (its rows "
            f"start at {prefill.prompt_start}, the prompt has {p} tokens), as a decode "
            f"replica's sample decoded from P{swapped}"
        )
    t_prefill, t_decode = prefill.routes_TLK.shape[0], decode.routes_TLK.shape[0]
    if t_decode < t_prefill:
        raise EngineOutputError(
            f"merge_split_routes: the sample passed as decode has {t_decode} tokens, fewer "
            f"than the {t_prefill} of the sample passed as prefill, which samples one token "
            f"and stops{swapped}"
        )


def merge_split_routes(prefill: SampleRoutes, decode: SampleRoutes) -> SampleRoutes:
    """One sample of a split deployment: the prefill replica's prompt rows, then the decode
    replica's rows from the first generated token on.

    ``prefill``: the prefill replica's sample (its prompt, and the token it sampled: rows
    ``[start, P)``); ``decode``: the decode replica's sample of the same prompt (any decoder,
    streamed answers included; decoded from ``prompt_start = P`` so that its prompt rows are
    never read). Raises :class:`~rr_vllm.EngineOutputError` when the prompt lengths differ, a
    replica's rows are of another shape or dtype, the prefill rows do not cover the prompt from
    their start, or the decode replica has no row at ``P`` while it generated past it."""
    prefill, decode = _name(prefill, "prefill"), _name(decode, "decode")
    p = decode.num_prompt_tokens
    if prefill.num_prompt_tokens != p:
        raise EngineOutputError(
            f"merge_split_routes: the prefill replica's sample has {prefill.num_prompt_tokens} "
            f"prompt tokens, the decode replica's {p}: not the same request"
        )
    _check_sides(prefill, decode, p)
    for role, s in (("prefill", prefill), ("decode", decode)):
        if s.aborted:
            raise EngineOutputError(
                f"merge_split_routes: the {role} replica's request was aborted "
                f"(finish_reason {s.finish_reason!r}); there are no routes to join"
            )
    a, b = prefill.routes_TLK, decode.routes_TLK
    if a.shape[1:] != b.shape[1:]:
        raise EngineOutputError(
            f"merge_split_routes: prefill rows are [{', '.join(map(str, a.shape[1:]))}] per "
            f"token, decode rows [{', '.join(map(str, b.shape[1:]))}]: decoded with other "
            "model metas"
        )
    if a.dtype != b.dtype:
        raise EngineOutputError(
            f"merge_split_routes: prefill ids are {a.dtype}, decode ids {b.dtype}; the two "
            "replicas run different releases or settings (compact uint8 ids on one): decode "
            "both the same way, or upgrade the older replica"
        )
    if a.shape[0] < p:
        raise EngineOutputError(
            f"merge_split_routes: the prefill replica's sample has {a.shape[0]} tokens, fewer "
            f"than the prompt's {p}"
        )
    start = prefill.prompt_start
    missing = np.flatnonzero(~prefill.valid_T[start:p])
    if missing.size:
        raise EngineOutputError(
            f"merge_split_routes: the prefill replica has no route for prompt token(s) "
            f"{(missing + start)[:8].tolist()} (rows from {start}); its answer lost rows"
        )
    t = b.shape[0]
    if t - 1 > p and not decode.valid_T[p]:
        raise EngineOutputError(
            f"merge_split_routes: the decode replica has no row for token {p} (the first "
            f"generated token; its rows start at {decode.prompt_start}): send "
            f"routed_experts_prompt_start / routed_experts_start_len <= {p}"
        )
    routes, valid = b.copy(), decode.valid_T.copy()
    routes[:p], valid[:p] = a[:p], prefill.valid_T[:p]
    return SampleRoutes(
        routes_TLK=routes,
        valid_T=valid,
        num_prompt_tokens=p,
        prompt_start=start,
        finish_reason=decode.finish_reason,
    )
