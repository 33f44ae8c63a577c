"""Assembly: resumed partial rollouts, truncation, n > 1 completions, and the trainer's padded
layout (multi-turn trajectories are :mod:`rr_vllm.turns`').

Shape legend: T tokens of a sample, N rows of a batch, B samples, S = prompt_length +
response_length, L layer slots (all_layers axis), K top-k, P prompt tokens, G generated tokens.

Everything works on absolute token positions: a :class:`~rr_vllm.SampleRoutes` row t is token t,
so rows are never shifted, and a token without a recorded route is an invalid row (zeros), never
expert 0 replayed (D2).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from rr_core import AlignmentError, RouteBatch, narrowest_dtype
from rr_core.buffers import zeros
from rr_core.checks import check_sequence
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import integer, integers
from rr_vllm.samples import SampleRoutes, check_sample, check_samples


def truncate_sample(sample: SampleRoutes, num_tokens: int) -> SampleRoutes:
    """The first ``num_tokens`` rows (views, nothing copied), for tokens cut after generation
    (D7): a client-side stop string, or a response cut to the trainer's length."""
    sample = check_sample(sample, "truncate_sample's sample", AlignmentError)
    t, n = sample.routes_TLK.shape[0], integer(num_tokens, "num_tokens", error=AlignmentError)
    if not sample.num_prompt_tokens <= n <= t:
        raise AlignmentError(
            f"cannot truncate a sample of {t} tokens (P={sample.num_prompt_tokens}) to {n}: "
            f"truncation keeps {sample.num_prompt_tokens}..{t} tokens and never extends (D7); see "
            "`rr explain D7`"
        )
    return dataclasses.replace(sample, routes_TLK=sample.routes_TLK[:n], valid_T=sample.valid_T[:n])


def truncate_response(sample: SampleRoutes, response_length: int) -> SampleRoutes:
    """Cut the response to at most ``response_length`` tokens, its routes with it (D7)."""
    t = check_sample(sample, "truncate_response's sample", AlignmentError).routes_TLK.shape[0]
    n = integer(response_length, "response_length", error=AlignmentError)
    return truncate_sample(sample, min(t, sample.num_prompt_tokens + n))


def assemble_resumed(
    attempts: Sequence[SampleRoutes | None], new_tokens: Sequence[int], *, num_prompt_tokens: int
) -> SampleRoutes:
    """A partial rollout resumed over several attempts: attempt k was sent the prompt plus every
    earlier token and generated ``new_tokens[k]`` more. The first attempt with routes gives all
    its rows; each later one only its last ``new_tokens[k]`` rows (positions ``context - 1``
    onwards); attempts without tokens or routes (None, or all rows invalid) are skipped, so the
    rows of their tokens stay invalid (D2, D4)."""
    attempts = check_samples(attempts, "attempts", AlignmentError)
    new_tokens = check_sequence(new_tokens, "new_tokens", AlignmentError)
    if len(attempts) != len(new_tokens) or not attempts:
        raise AlignmentError(
            f"need one token count per attempt; got {len(attempts)} attempts, "
            f"{len(new_tokens)} counts"
        )
    counts = integers(new_tokens, "new_tokens", error=AlignmentError)
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=AlignmentError)
    ends = np.cumsum([p, *counts])
    found = [(k, a) for k, a in enumerate(attempts) if a is not None and counts[k] > 0]
    for k, a in found:
        if a.num_prompt_tokens != ends[k] or a.routes_TLK.shape[0] != ends[k + 1]:
            raise AlignmentError(
                f"attempt {k} has a {a.num_prompt_tokens}-token context and "
                f"{a.routes_TLK.shape[0]} tokens; expected context {ends[k]} (prompt + earlier "
                f"attempts) and {ends[k + 1]} tokens: attempts out of order or token counts "
                "wrong (D2); see `rr explain D2`"
            )
    found = [(k, a) for k, a in found if a.valid_T.any()]
    if not found:
        raise AlignmentError("no attempt carries routes; every row would be invalid")
    _, L, K = found[0][1].routes_TLK.shape
    dtype = np.result_type(*(a.routes_TLK for _, a in found))
    routes = np.zeros((int(ends[-1]), L, K), dtype=dtype)
    valid = np.zeros(int(ends[-1]), dtype=bool)
    first, a0 = found[0]
    routes[: ends[first + 1]] = a0.routes_TLK
    valid[: ends[first + 1]] = a0.valid_T
    for k, a in found[1:]:
        rows = slice(int(ends[k]) - 1, int(ends[k + 1]))
        routes[rows] = a.routes_TLK[rows]
        valid[rows] = a.valid_T[rows]
    return dataclasses.replace(
        a0,
        routes_TLK=routes,
        valid_T=valid,
        num_prompt_tokens=p,
        finish_reason=found[-1][1].finish_reason,
    )


def flatten_completions(
    per_request: Sequence[Sequence[SampleRoutes | None]],
) -> list[SampleRoutes | None]:
    """n > 1: the completions of every request, request-major (the order of the token batch)."""
    requests = check_sequence(per_request, "per_request", EngineOutputError)
    return [s for i, c in enumerate(requests) for s in check_samples(c, f"per_request[{i}]")]


class TrainerLayout(NamedTuple):
    """``[B, S, L, K]`` routes with a left-padded prompt and a right-padded response;
    ``valid_BS`` marks rows to replay, ``token_mask_BS`` real tokens (``RouteBatch.from_padded``
    takes both back)."""

    routes_BSLK: torch.Tensor
    valid_BS: torch.Tensor
    token_mask_BS: torch.Tensor


def to_trainer_layout(
    batch: RouteBatch,
    num_prompt_tokens: Sequence[int] | torch.Tensor,
    *,
    prompt_length: int,
    response_length: int,
    dtype: torch.dtype = torch.int16,
) -> TrainerLayout:
    """Sample b's prompt ends at position ``prompt_length`` and its response starts there (one
    slice copy per sample, no loop over rows). Truncate responses first (D7)."""
    if not isinstance(batch, RouteBatch):
        raise AlignmentError(f"batch must be a RouteBatch; got {type(batch).__name__}")
    for name, value in (("prompt_length", prompt_length), ("response_length", response_length)):
        if integer(value, name, error=AlignmentError) >= 2**31:
            raise AlignmentError(f"{name} must be below 2**31 token positions; got {value}")
    B, (_, L, K), S = batch.num_sequences, batch.values_NLK.shape, prompt_length + response_length
    dev = batch.values_NLK.device
    if not isinstance(dtype, torch.dtype):
        raise AlignmentError(f"dtype must be a torch integer dtype; got {dtype!r}")
    prompts = integers(num_prompt_tokens, "num_prompt_tokens", error=AlignmentError)
    p_B = torch.tensor(prompts, dtype=torch.int64, device=dev)
    lengths = batch.lengths
    if p_B.numel() != B:
        raise AlignmentError(f"{p_B.numel()} prompt lengths for {B} samples")
    g_B = lengths - p_B
    bad = (p_B > prompt_length) | (g_B > response_length) | (g_B < 0)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise AlignmentError(
            f"sample {b} has P={int(p_B[b])}, G={int(g_B[b])} tokens; the layout holds "
            f"P <= prompt_length={prompt_length} and G <= response_length={response_length}: "
            "truncate the response with its routes first (truncate_response, D7); see "
            "`rr explain D7`"
        )
    if dtype.is_floating_point or torch.iinfo(dtype).max < batch.meta.num_experts - 1:
        raise AlignmentError(
            f"{dtype} cannot hold ids up to {batch.meta.num_experts - 1}; use "
            f"{narrowest_dtype(batch.meta.num_experts)} or wider"
        )
    routes = zeros((B * S, L, K), dtype, dev)  # huge pages on the CPU: ~800 MB fresh
    valid = torch.zeros(B * S, dtype=torch.bool, device=dev)
    offsets, starts = batch.offsets_B1.tolist(), (prompt_length - p_B).tolist()
    for b, (first, end) in enumerate(itertools.pairwise(offsets)):  # one slice copy per sample
        at = b * S + starts[b]
        routes[at : at + end - first].copy_(batch.values_NLK[first:end])
        valid[at : at + end - first] = batch.valid_N[first:end]
    pos_1S = torch.arange(S, device=dev)[None, :]
    token_mask = (pos_1S >= (prompt_length - p_B)[:, None]) & (
        pos_1S < (prompt_length + g_B)[:, None]
    )
    return TrainerLayout(routes.view(B, S, L, K), valid.view(B, S), token_mask)
