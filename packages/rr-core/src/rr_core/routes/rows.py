"""How many route rows an engine returns for a sequence: the one home of the T-1 rule (D1, G4).

Row ``i`` of an engine's answer is token ``prompt_start + i``, routed when that token was the
input; the last sampled token was never fed back, so it has no row. A sequence of ``T`` tokens
whose rows start at ``prompt_start`` therefore comes back with ``T - 1 - prompt_start`` rows (none
when ``prompt_start == T``). A route for every token (``T`` rows) is a recorded forward's form,
accepted from token 0 only: from ``prompt_start > 0`` one row more than the rule is the answer of
a request sent with ``prompt_start - 1`` (what ``P - 1`` for ``P`` on vLLM 0.22-0.29 gives, G4),
and reading it as one row per token from ``prompt_start`` would put every row one token late.
"""

from __future__ import annotations

from rr_core.checks import as_index
from rr_core.errors import AlignmentError

__all__ = ["check_route_rows", "expected_route_rows"]


def expected_route_rows(num_tokens: int, *, prompt_start: int = 0) -> int:
    """``T - 1 - prompt_start`` (0 when ``prompt_start == T``): the rows an engine returns for
    ``num_tokens`` tokens with rows from ``prompt_start``. ``num_tokens < 0`` or a
    ``prompt_start`` outside ``0..T`` raises :class:`~rr_core.AlignmentError`."""
    T = as_index(num_tokens, "num_tokens", AlignmentError)
    start = as_index(prompt_start, "prompt_start", AlignmentError)
    if T < 0 or not 0 <= start <= T:
        raise AlignmentError(
            f"need num_tokens >= 0 and prompt_start in [0, num_tokens]; got num_tokens={T}, "
            f"prompt_start={start}"
        )
    return max(T - 1 - start, 0)


def check_route_rows(num_rows: int, num_tokens: int, *, prompt_start: int = 0) -> None:
    """Accept :func:`expected_route_rows` rows, or ``T`` rows from ``prompt_start == 0`` (a route
    for every token); raise :class:`~rr_core.AlignmentError` otherwise, naming G4 for one row more
    from ``prompt_start > 0``."""
    expected = expected_route_rows(num_tokens, prompt_start=prompt_start)
    n = as_index(num_rows, "num_rows", AlignmentError)
    T, start = int(num_tokens), int(prompt_start)
    if n == expected or (start == 0 and n == T):
        return
    if 0 < start < T and n == expected + 1:
        raise AlignmentError(
            f"engine returned N={n} route rows for T={T} tokens with prompt_start={start}; "
            f"expected {expected} (T - prompt_start - 1). One row more is the answer of a "
            f"request sent with prompt_start={start - 1}, as rr_vllm's vllm_sampling_fields sends "
            "P - 1 for P on vLLM 0.22-0.29 (G4): decode with the start that was sent "
            "(fields['routed_experts_prompt_start']), then drop the extra row "
            "(rr_vllm.drop_rows_before); see `rr explain G4`"
        )
    accepted = f"{expected} or {T}" if start == 0 and expected != T else str(expected)
    raise AlignmentError(
        f"engine returned N={n} route rows for T={T} tokens with prompt_start={start}; expected "
        f"{accepted} (T - prompt_start - 1 without the last sampled token"
        f"{', or T from token 0' if start == 0 else ''}); routes and tokens belong to different "
        "sequences or were trimmed differently (D1, D7); see `rr explain D1` and `rr explain D7`"
    )
