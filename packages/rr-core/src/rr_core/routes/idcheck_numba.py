"""The row-word checks of :mod:`rr_core.routes.idcheck_words` compiled into one pass (numba,
optional: ``pip install rr-core[numba]``; vLLM itself pins numba, so an rr-vllm user has it).

Each word is read once and its three flags written at once, where numpy makes some thirty
passes over cached chunks; the formulas are the same, so the flags are equal bit for bit. One
kernel per (word width, range test) is compiled on first use and cached on disk by numba. The
kernels release the GIL, so :func:`rr_core.threads.over_ranges` runs them on several threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rr_core.kernels import compile_kernel, numba_module

#: ``(bits, range test, kernel)`` -> compiled kernel (see :func:`scan`, :func:`any_bad`).
_KERNELS: dict[tuple[int, str, str], Callable[..., Any]] = {}


def range_test(num_experts: int) -> str:
    """How a byte ``x >= E`` is found (see ``idcheck_words._high_bytes``)."""
    return "none" if num_experts >= 256 else "or" if num_experts <= 128 else "and"


def _every_byte(word: type[np.unsignedinteger[Any]], bits: int, byte: int) -> Any:
    return word(int.from_bytes(bytes([byte]) * (bits // 8), "little"))


def _word_test(w, add, constants, turns, test):  # type: ignore[no-untyped-def]
    """``(out of range, repeated)`` of one row-word (compiled into the kernels that call it)."""
    zero, ones, high, low7 = constants
    z = zero
    for turn in turns:  # a zero byte of w ^ rotate(w) is a repeated id
        y = ((w >> turn[0]) | (w << turn[1])) ^ w
        z |= (y - ones) & ~y  # with & high: non-zero iff y has a zero byte
    if test == 0:
        out = False
    elif test == 1:
        out = ((((w & low7) + add) | w) & high) != zero
    else:
        out = ((((w & low7) + add) & w) & high) != zero
    return out, (z & high) != zero


def _build(word: type[np.unsignedinteger[Any]], test_name: str, which: str) -> Callable[..., Any]:
    numba = numba_module()
    bits = 8 * np.dtype(word).itemsize
    zero = word(0)
    constants = (zero, *(_every_byte(word, bits, b) for b in (0x01, 0x80, 0x7F)))
    # (d, bits - d) of each rotation by d bits, d in 8..bits/2 (typed: numba would mix
    # uint64 with int64 literals into float64)
    turns = tuple((word(d), word(bits - d)) for d in range(8, bits // 2 + 1, 8))
    test = ("none", "or", "and").index(test_name)
    word_test = numba.extending.register_jitable(_word_test)

    def scan(words, add, out_R, repeated_R, nonzero_R):  # type: ignore[no-untyped-def]
        for i in range(words.size):
            w = words[i]
            out_R[i], repeated_R[i] = word_test(w, add, constants, turns, test)
            nonzero_R[i] = w != zero

    def any_bad(words_RL, slots_S, rows_T, mask_T, add):  # type: ignore[no-untyped-def]
        masked = mask_T.shape[0] > 0
        by_rows = rows_T.shape[0] > 0
        every_slot = slots_S.shape[0] == 0
        n = mask_T.shape[0] if masked else rows_T.shape[0] if by_rows else words_RL.shape[0]
        bad = False
        for t in range(n):
            if masked and not mask_T[t]:
                continue
            row = words_RL[rows_T[t] if by_rows else t]
            if every_slot:  # one OR over the row: no branch, no index
                for j in range(row.shape[0]):
                    out, repeated = word_test(row[j], add, constants, turns, test)
                    bad |= out | repeated
            else:
                for j in range(slots_S.shape[0]):
                    out, repeated = word_test(row[slots_S[j]], add, constants, turns, test)
                    bad |= out | repeated
        return bad

    return compile_kernel(scan if which == "scan" else any_bad)  # type: ignore[no-any-return]


def _kernel(word: type[np.unsignedinteger[Any]], num_experts: int, which: str) -> Any:
    bits, test = np.dtype(word).itemsize * 8, range_test(num_experts)
    key = (bits, test, which)
    if key not in _KERNELS:
        _KERNELS[key] = _build(word, test, which)
    bias = {"none": 0, "or": 128 - num_experts, "and": 256 - num_experts}[test]
    return _KERNELS[key], _every_byte(word, bits, bias)


def scan(words: np.ndarray, num_experts: int, flags_3R: np.ndarray) -> None:
    """Fill ``flags_3R`` (out of range, repeated, non-zero) for ``words`` (one row per word)."""
    kernel, add = _kernel(words.dtype.type, num_experts, "scan")
    kernel(words, add, flags_3R[0], flags_3R[1], flags_3R[2])


def any_bad(
    words_RL: np.ndarray,
    num_experts: int,
    slots: np.ndarray,
    rows_T: np.ndarray,
    mask_T: np.ndarray,
) -> bool:
    """Whether a word ``words_RL[rows_T[t], s]`` (row t without a row index) for a slot s of
    ``slots`` (every slot when empty) and a t where ``mask_T`` holds (every t when empty) holds
    an id outside ``[0, E)`` or repeats one: the checks of :func:`scan` without writing a flag,
    through the row index and the mask, in one pass."""
    kernel, add = _kernel(words_RL.dtype.type, num_experts, "any_bad")
    return bool(kernel(words_RL, slots, rows_T, mask_T, add))
