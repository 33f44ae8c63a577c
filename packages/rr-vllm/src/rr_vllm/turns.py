"""Multi-turn trajectories: gathered turn by turn without re-sending prefix routes (G6), or
from the last turn alone (:func:`assemble_multi_turn`). The one home of multi-turn assembly.

An agent re-sends the whole conversation every turn; with ``routed_experts_prompt_start`` left
at 0 the routes of the prefix come back every turn, O(N^2) over a trajectory. A
:class:`Trajectory` asks each turn only for the rows it does not hold (``prompt_start`` = the
tokens already routed, vLLM >= 0.22), keeps the earlier rows (views of the engine arrays,
nothing copied until :meth:`Trajectory.routes`) and checks every turn against what it holds:
the prompt must extend the routed tokens, the turn's rows must start where the held rows end
(or overlap them, compared row by row) and count ``P + G - 1 - start``.

vLLM's cached-prefix omission (RFC #56402, PRs #57025 / #57966, open, in no release) returns
prompt rows from ``max(prompt_start, num_cached_tokens)`` and needs a stable ``x-session-id``
header (it salts the prefix cache, so a hit can only come from this session's earlier turns).
It is decoded here as those PRs describe, behind the explicit ``omit_cached_prefix=True`` (the
server flag ``--enable-omit-prefix-routed-experts``); no version flag, since no release has it.

:func:`assemble_multi_turn` is the other way: one request for the whole context (every prefix
row re-sent, as on vLLM 0.21, which has no ``prompt_start``), whose last turn covers every
token up to its last generation; tokens appended after it (tool output) are invalid rows (D2).

Shape legend: T tokens, N rows, L layer slots (all_layers axis), K top-k, P prompt tokens of a
turn, G its generated tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from rr_core import AlignmentError, RouteMeta, expected_route_rows
from rr_core.checks import check_choice, check_flag
from rr_vllm.errors import CaptureError, EngineOutputError
from rr_vllm.fields import MAX_TOKENS, attr, integer, integers, reason
from rr_vllm.prompt_start import prompt_start_to_send
from rr_vllm.releases import resolve_flags
from rr_vllm.samples import (
    IntArray,
    SampleRoutes,
    as_rows,
    check_missing,
    check_sample,
    is_aborted,
)

MismatchPolicy = Literal["count", "raise"]


def omission_start(prompt_start: int, num_cached_tokens: int | None) -> int:
    """Where the rows of a request start under cached-prefix omission (RFC #56402):
    ``max(prompt_start, num_cached_tokens)``; decode with it."""
    start = integer(prompt_start, "prompt_start")
    cached = 0 if num_cached_tokens is None else integer(num_cached_tokens, "num_cached_tokens")
    return max(start, cached)


def _sorted_ids(rows: IntArray) -> IntArray:
    return np.sort(rows, axis=-1)


class Trajectory:
    """The routes of one multi-turn trajectory, gathered turn by turn.

    Per turn: send ``routed_experts_prompt_start=trajectory.prompt_start(prompt_ids)`` (and
    :attr:`headers` when omitting the cached prefix), then :meth:`add_vllm_output` (or
    :meth:`add_turn` with a decoded wire array). :meth:`routes` gives the whole trajectory as
    one :class:`~rr_vllm.SampleRoutes` on absolute positions.

    Overlapping rows (a turn sent a start below the rows held: vLLM < 0.22, or ``P - 1`` for
    ``P`` on 0.22-0.29, G4) are compared with the held ones as id sets: ``on_mismatch="count"``
    adds differing rows to :attr:`mismatched_rows` (an engine that is not batch-invariant may
    break a near-tie differently), ``"raise"`` raises. The row of the last prompt token is
    taken from the turn that sampled the next token, the rest from the earlier turn.
    """

    def __init__(
        self,
        meta: RouteMeta,
        *,
        num_prompt_tokens: int,
        vllm_version: str | None = None,
        omit_cached_prefix: bool = False,
        session_id: str | None = None,
        on_mismatch: MismatchPolicy = "count",
    ) -> None:
        self.flags = resolve_flags(vllm_version)
        if self.flags.split_arrays:
            raise CaptureError(
                f"vLLM {self.flags.version} splits prompt and generation rows and has no "
                "prompt_start; gather its turns with assemble_multi_turn on the last turn"
            )
        check_flag(omit_cached_prefix, "omit_cached_prefix", CaptureError)
        check_choice(on_mismatch, "on_mismatch", ("count", "raise"), CaptureError)
        if omit_cached_prefix and not (isinstance(session_id, str) and session_id):
            raise CaptureError(
                "cached-prefix omission (--enable-omit-prefix-routed-experts, vLLM RFC #56402) "
                "needs a stable session id sent as the x-session-id header, so that a prefix "
                f"hit comes from this trajectory's own turns; got session_id={session_id!r}"
            )
        self.meta = meta
        self.num_prompt_tokens = integer(
            num_prompt_tokens, "num_prompt_tokens", error=CaptureError, minimum=1
        )
        self.omit_cached_prefix = omit_cached_prefix
        self.session_id = session_id
        self.on_mismatch = on_mismatch
        self.mismatched_rows = 0
        self.finish_reason: str | None = None
        self._blocks: list[IntArray] = []  # consecutive rows of tokens 0..routed_tokens-1
        self._tokens = np.zeros(0, dtype=np.int64)  # every token so far (the last has no row)
        self._routed = 0

    @property
    def routed_tokens(self) -> int:
        """Tokens whose rows are held: ``0..routed_tokens-1``."""
        return self._routed

    @property
    def num_tokens(self) -> int:
        return int(self._tokens.shape[0])

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of every turn's request: ``x-session-id`` where a session id is set."""
        return {"x-session-id": self.session_id} if self.session_id else {}

    def _check_prompt(self, prompt_token_ids: Any) -> np.ndarray:
        prompt = np.asarray(integers(prompt_token_ids, "prompt_token_ids"), dtype=np.int64)
        p, n = prompt.shape[0], self._routed
        if not self._blocks and p < self.num_prompt_tokens:
            raise EngineOutputError(
                f"the first turn's prompt has {p} tokens; the trajectory's prompt has "
                f"{self.num_prompt_tokens}"
            )
        if p < n or not np.array_equal(prompt[:n], self._tokens[:n]):
            diff = np.flatnonzero(prompt[: min(p, n)] != self._tokens[: min(p, n)])
            at = int(diff[0]) if diff.size else min(p, n)
            raise EngineOutputError(
                f"the turn's prompt ({p} tokens) does not extend the {n} routed tokens of the "
                f"trajectory: they differ from token {at} (a re-rendered or compacted "
                "history?); rows of other tokens cannot be stitched: start a new Trajectory"
            )
        return prompt

    def prompt_start(self, prompt_token_ids: Any) -> int:
        """The ``routed_experts_prompt_start`` to send with the next turn's prompt: the tokens
        already routed (0 on vLLM < 0.22, ``P - 1`` for ``P`` on 0.22-0.29, G4)."""
        prompt = self._check_prompt(prompt_token_ids)
        start = self._routed if self.flags.prompt_start else 0
        return prompt_start_to_send(start, prompt.shape[0], self.flags)

    def add_turn(
        self,
        prompt_token_ids: Any,
        generated_token_ids: Any,
        rows: Any,
        *,
        prompt_start: int,
        num_cached_tokens: int | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """One turn: its prompt and generated ids, the engine's ``[N, L, K]`` rows (numpy or a
        CPU tensor; ``npy_base64_to_array`` of an HTTP choice), the ``prompt_start`` it was sent
        and, under omission, the answer's ``num_cached_tokens``."""
        what = f"turn {len(self._blocks)}"
        prompt = self._check_prompt(prompt_token_ids)
        generated = np.asarray(integers(generated_token_ids, f"{what}: token ids"), np.int64)
        p, g = prompt.shape[0], generated.shape[0]
        if is_aborted(finish_reason):
            raise EngineOutputError(
                f"{what} was aborted (finish_reason={finish_reason!r}); its routes may be cut: "
                "resubmit the turn (assemble_resumed joins resumed attempts)"
            )
        if rows is None:
            check_missing(what, finish_reason)
        start = integer(prompt_start, f"{what}: prompt_start")
        if self.omit_cached_prefix:
            start = omission_start(start, num_cached_tokens)
        if g < 1 or start > self._routed or start > p:
            raise EngineOutputError(
                f"{what}: rows start at token {start} (prompt_start, or num_cached_tokens under "
                f"omission) but the trajectory holds rows of {self._routed} tokens and the turn "
                f"has P={p}, G={g}: rows {self._routed}..{start - 1} are missing. A prefix hit "
                "from another trajectory under the same session id, or a wrong prompt_start; "
                "use one session id per trajectory (or turn omission off)"
            )
        block = as_rows(rows, what)
        L, K = len(self.meta.layer_numbers), self.meta.top_k
        expected = expected_route_rows(p + g, prompt_start=start)
        if block.shape != (expected, L, K):
            raise EngineOutputError(
                f"{what}: rows have shape {tuple(block.shape)}; expected [{expected}, {L}, {K}]: "
                f"P + G - 1 - start = {p} + {g} - 1 - {start} rows on all {L} decoder layers, "
                "top_k from the meta (wrong prompt_start, or a turn of another trajectory?)"
            )
        # A prompt of exactly the routed tokens (the last sampled token dropped): the row of
        # its last token comes from this turn, whose forward sampled the token after it.
        keep = self._routed if p > self._routed else max(p - 1, start)
        self._compare(block[: self._routed - start], start, what)
        self._truncate(keep)
        self._blocks.append(block[keep - start :])
        self._tokens = np.concatenate([prompt, generated])
        self._routed = p + g - 1
        self.finish_reason = finish_reason

    def _compare(self, overlap: IntArray, start: int, what: str) -> None:
        if not overlap.shape[0]:
            return
        held = self._rows(start, start + overlap.shape[0])
        differ_R = (_sorted_ids(held) != _sorted_ids(overlap)).any(axis=(1, 2))
        n = int(differ_R.sum())
        if n and self.on_mismatch == "raise":
            first = start + int(np.flatnonzero(differ_R)[0])
            raise EngineOutputError(
                f"{what}: {n} of the {overlap.shape[0]} re-sent rows ({start}..) route other "
                f"experts than the rows held, first at token {first}: a shifted prompt_start, or "
                "an engine that is not batch-invariant (on_mismatch='count' tolerates that)"
            )
        self.mismatched_rows += n

    def _rows(self, begin: int, end: int) -> IntArray:
        """Held rows ``begin..end-1`` (one small copy, of the overlap only)."""
        out, at = [], 0
        for b in self._blocks:
            lo, hi = max(begin - at, 0), min(end - at, b.shape[0])
            if lo < hi:
                out.append(b[lo:hi])
            at += b.shape[0]
        return np.concatenate(out) if out else np.zeros((0, *self._blocks[0].shape[1:]))

    def _truncate(self, n: int) -> None:
        at = 0
        for i, b in enumerate(self._blocks):
            if at + b.shape[0] >= n:
                self._blocks[i:] = [b[: n - at]]
                return
            at += b.shape[0]

    def add_vllm_output(
        self, request_output: Any, *, prompt_start: int, completion: int = 0
    ) -> None:
        """One turn from a vLLM ``RequestOutput`` (real or duck-typed, 0.22+), sent with
        ``prompt_start``; ``completion`` picks one of n > 1 (read by attribute, each field
        checked, as :func:`~rr_vllm.decode_vllm_output` reads it)."""
        what = f"request {getattr(request_output, 'request_id', '?')}"
        outputs = attr(request_output, "outputs", what)
        if isinstance(outputs, str | bytes | Mapping) or not isinstance(outputs, Sequence):
            raise EngineOutputError(
                f"{what}: outputs must be a list of CompletionOutput; got {type(outputs).__name__}"
            )
        if not 0 <= completion < len(outputs):
            raise EngineOutputError(
                f"{what} has {len(outputs)} completions; got completion={completion}"
            )
        c = outputs[completion]
        where = f"{what}, completion {getattr(c, 'index', completion)}"
        cached = attr(request_output, "num_cached_tokens", where)
        self.add_turn(
            attr(request_output, "prompt_token_ids", where),
            attr(c, "token_ids", where),
            attr(c, "routed_experts", where),
            prompt_start=prompt_start,
            num_cached_tokens=cached if self.omit_cached_prefix else None,
            finish_reason=reason(attr(c, "finish_reason", where), f"{where}: finish_reason"),
        )

    def routes(self, num_tokens: int | None = None) -> SampleRoutes:
        """The trajectory (``num_tokens`` tokens, default every token so far) as one sample:
        rows of the routed tokens valid, later ones (the last sampled token, tool output
        appended after the last turn) invalid (D2). The one copy of the rows."""
        if not self._blocks:
            raise EngineOutputError("the trajectory has no turn yet")
        t = self.num_tokens if num_tokens is None else integer(num_tokens, "num_tokens")
        if t < self.num_tokens:
            raise EngineOutputError(
                f"num_tokens={t} is shorter than the trajectory's {self.num_tokens} tokens: "
                "truncate afterwards with truncate_response (see `rr explain D7`)"
            )
        L, K = self._blocks[0].shape[1:]
        routes_TLK = np.zeros((t, L, K), dtype=np.result_type(*self._blocks))
        np.concatenate(self._blocks, out=routes_TLK[: self._routed])
        valid_T = np.zeros(t, dtype=bool)
        valid_T[: self._routed] = True
        return SampleRoutes(
            routes_TLK=routes_TLK,
            valid_T=valid_T,
            num_prompt_tokens=self.num_prompt_tokens,
            prompt_start=0,
            finish_reason=self.finish_reason,
        )


def assemble_multi_turn(
    last_turn: SampleRoutes, *, num_tokens: int, num_prompt_tokens: int
) -> SampleRoutes:
    """A multi-turn trajectory of ``num_tokens`` tokens whose first ``num_prompt_tokens`` are
    the original prompt: the last turn's routes cover the whole context up to its last
    generation; tokens appended after it (tool output) are invalid rows (D2)."""
    t = check_sample(last_turn, "last_turn", AlignmentError).routes_TLK.shape[0]
    n = integer(num_tokens, "num_tokens", error=AlignmentError, maximum=MAX_TOKENS)
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=AlignmentError)
    if n < t or not 0 <= p <= last_turn.num_prompt_tokens:
        raise AlignmentError(
            f"the last turn covers {t} tokens (context {last_turn.num_prompt_tokens}); the "
            f"trajectory has {n} tokens and a {p}-token prompt: the trajectory must extend the "
            "last turn (truncate afterwards with truncate_response) and start with its prompt "
            "(D2); see `rr explain D2`"
        )
    _, L, K = last_turn.routes_TLK.shape
    routes = np.zeros((n, L, K), dtype=last_turn.routes_TLK.dtype)
    valid = np.zeros(n, dtype=bool)
    routes[:t] = last_turn.routes_TLK
    valid[:t] = last_turn.valid_T
    return dataclasses.replace(last_turn, routes_TLK=routes, valid_T=valid, num_prompt_tokens=p)
