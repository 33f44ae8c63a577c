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

#: ``(bits, range test)`` -> compiled kernel ``(words, add, out_R, repeated_R, nonzero_R)``.
_KERNELS: dict[tuple[int, str], Callable[..., None]] = {}


def range_test(num_experts: int) -> str:
    """How a byte ``x >= E`` is found (see ``idcheck_words._high_bytes``)."""
    return "none" if num_experts >= 256 else "or" if num_experts <= 128 else "and"


def _every_byte(word: type[np.unsignedinteger[Any]], bits: int, byte: int) -> Any:
    return word(int.from_bytes(bytes([byte]) * (bits // 8), "little"))


def _build(word: type[np.unsignedinteger[Any]], test: str) -> Callable[..., None]:
    numba = numba_module()
    bits = 8 * np.dtype(word).itemsize
    zero, ones = word(0), _every_byte(word, bits, 0x01)
    high, low7 = _every_byte(word, bits, 0x80), _every_byte(word, bits, 0x7F)
    # (d, bits - d) of each rotation by d bits, d in 8..bits/2 (typed: numba would mix
    # uint64 with int64 literals into float64)
    turns = tuple((word(d), word(bits - d)) for d in range(8, bits // 2 + 1, 8))
    unroll = numba.literal_unroll

    def scan(words, add, out_R, repeated_R, nonzero_R):  # type: ignore[no-untyped-def]
        for i in range(words.size):
            w = words[i]
            z = zero
            for turn in unroll(turns):  # a zero byte of w ^ rotate(w) is a repeated id
                y = ((w >> turn[0]) | (w << turn[1])) ^ w
                z |= (y - ones) & ~y  # with & high: non-zero iff y has a zero byte
            repeated_R[i] = (z & high) != zero
            if test == "none":
                out_R[i] = False
            elif test == "or":
                out_R[i] = ((((w & low7) + add) | w) & high) != zero
            else:
                out_R[i] = ((((w & low7) + add) & w) & high) != zero
            nonzero_R[i] = w != zero

    return compile_kernel(scan)  # type: ignore[no-any-return]


def scan(words: np.ndarray, num_experts: int, flags_3R: np.ndarray) -> None:
    """Fill ``flags_3R`` (out of range, repeated, non-zero) for ``words`` (one row per word)."""
    word = words.dtype.type
    test = range_test(num_experts)
    key = (words.itemsize * 8, test)
    if key not in _KERNELS:
        _KERNELS[key] = _build(word, test)
    bias = {"none": 0, "or": 128 - num_experts, "and": 256 - num_experts}[test]
    add = _every_byte(word, key[0], bias)
    _KERNELS[key](words, add, flags_3R[0], flags_3R[1], flags_3R[2])
