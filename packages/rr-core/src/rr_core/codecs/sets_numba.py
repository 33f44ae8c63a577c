"""The set codec's ranking and bit packing of top-8 byte ids compiled into one pass (numba,
optional, chosen by :mod:`rr_core.kernels`), bit for bit the stream that
:func:`rr_core.codecs.sets_fast.rank_fast` and :class:`~rr_core.codecs.bitpack_words.WordPacker`
write.

Shape legend: R rows (token, MoE layer pairs) of K = 8 ids, one 64-bit word each.

Per block of rows: each row's 8 bytes sorted by the same 19-pair network (in registers), the
rank summed from the same four pair tables, a block with a repeated or out-of-range id refused
(the general path then names it); then each rank's ``width`` bits appended to the little-endian
stream a 64-bit word at a time. Ranges of rows start at multiples of 64 rows, so each starts
on a word and the threads of :func:`rr_core.threads.over_ranges` write disjoint words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rr_core.buffers import recycled
from rr_core.codecs.sets_fast import _pair_tables
from rr_core.kernels import compile_kernel
from rr_core.threads import over_ranges

_KERNEL: list[Callable[..., bool]] = []
_BLOCK = 1 << 12  # rows ranked into a cached scratch before they are packed


def _build() -> Callable[..., bool]:
    def sort_block(words, shift, num_experts, pairs):  # type: ignore[no-untyped-def]
        """Each row's ids sorted, as the four table indices ``c_2p | c_2p+1 << shift`` in the
        16-bit lanes of ``pairs``; False on a repeated or out-of-range id. Gathers and early
        exits stay out of this loop, so it vectorises."""
        bad = 0
        for i in range(words.size):
            w = words[i]
            c0, c1 = w & 0xFF, (w >> 8) & 0xFF
            c2, c3 = (w >> 16) & 0xFF, (w >> 24) & 0xFF
            c4, c5 = (w >> 32) & 0xFF, (w >> 40) & 0xFF
            c6, c7 = (w >> 48) & 0xFF, (w >> 56) & 0xFF  # int64: mask the sign
            # the 19 pairs of sets_fast._NETWORK, in order
            c0, c1 = min(c0, c1), max(c0, c1)
            c2, c3 = min(c2, c3), max(c2, c3)
            c4, c5 = min(c4, c5), max(c4, c5)
            c6, c7 = min(c6, c7), max(c6, c7)
            c0, c2 = min(c0, c2), max(c0, c2)
            c1, c3 = min(c1, c3), max(c1, c3)
            c4, c6 = min(c4, c6), max(c4, c6)
            c5, c7 = min(c5, c7), max(c5, c7)
            c1, c2 = min(c1, c2), max(c1, c2)
            c5, c6 = min(c5, c6), max(c5, c6)
            c0, c4 = min(c0, c4), max(c0, c4)
            c1, c5 = min(c1, c5), max(c1, c5)
            c2, c6 = min(c2, c6), max(c2, c6)
            c3, c7 = min(c3, c7), max(c3, c7)
            c2, c4 = min(c2, c4), max(c2, c4)
            c3, c5 = min(c3, c5), max(c3, c5)
            c1, c2 = min(c1, c2), max(c1, c2)
            c3, c4 = min(c3, c4), max(c3, c4)
            c5, c6 = min(c5, c6), max(c5, c6)
            same = (c0 == c1) | (c1 == c2) | (c2 == c3) | (c3 == c4) | (c4 == c5) | (c5 == c6)
            bad |= same | (c6 == c7) | (c7 >= num_experts)
            c7 = min(c7, num_experts - 1)  # every index stays in its table
            pairs[i] = (
                (c0 | (c1 << shift))
                | (c2 | (c3 << shift)) << 16
                | (c4 | (c5 << shift)) << 32
                | (c6 | (c7 << shift)) << 48
            )
        return bad == 0

    def rank_block(words, tables, shift, num_experts, pairs, ranks):  # type: ignore[no-untyped-def]
        """Ranks of ``words`` into ``ranks`` (``pairs``: scratch); False as :func:`sort_block`."""
        if not sort_block(words, shift, num_experts, pairs):  # type: ignore[no-untyped-call]
            return False
        for i in range(words.size):
            p = pairs[i]
            ranks[i] = (
                tables[0, p & 0xFFFF]
                + tables[1, (p >> 16) & 0xFFFF]
                + tables[2, (p >> 32) & 0xFFFF]
                + tables[3, (p >> 48) & 0xFFFF]
            )
        return True

    sort_block = compile_kernel(sort_block)
    rank_block = compile_kernel(rank_block)

    def rank_pack(words, tables, shift, num_experts, width, out, start, stop):  # type: ignore[no-untyped-def]
        ranks, pairs = np.empty(_BLOCK, dtype=np.int64), np.empty(_BLOCK, dtype=np.int64)
        acc = np.uint64(0)  # the bits of the current output word below ``bits``
        bits = np.uint64(0)
        word_bits, w64 = np.uint64(width), np.uint64(64)
        pos = start * width // 64
        for a in range(start, stop, _BLOCK):
            b = min(a + _BLOCK, stop)
            if not rank_block(words[a:b], tables, shift, num_experts, pairs, ranks):  # type: ignore[no-untyped-call]
                return False
            for i in range(b - a):
                rank = np.uint64(ranks[i])
                acc |= rank << bits
                bits += word_bits
                if bits >= w64:  # the word is full: the rank's high bits start the next one
                    out[pos] = acc
                    pos += 1
                    bits -= w64
                    acc = rank >> (word_bits - bits) if bits else np.uint64(0)
        if bits:  # only the last range ends inside a word
            out[pos] = acc
        return True

    return compile_kernel(rank_pack)  # type: ignore[no-any-return]


def rank_pack(ids_RK: torch.Tensor, num_experts: int, width: int) -> torch.Tensor | None:
    """The set payload (uint8 ``[ceil(R * width / 8)]``, ``0 < width <= 56``) of uint8 rows
    ``[R, 8]`` (one word each) of ids below ``num_experts <= 256``, or None if a row repeats an
    id or holds one out of range."""
    if not _KERNEL:
        _KERNEL.append(_build())
    R = ids_RK.shape[0]
    words = ids_RK.contiguous().numpy().view(np.int64).reshape(-1)
    shift, tables = _pair_tables(num_experts)
    out = recycled((-(-R * width // 64),), np.dtype(np.uint64))

    def run(start: int, stop: int) -> Any:
        return _KERNEL[0](words, tables, shift, num_experts, width, out, start, stop)

    if not all(over_ranges(R, 64, run)):  # ranges of 64 rows start on a word
        return None
    return torch.from_numpy(out.view(np.uint8)[: -(-R * width // 8)])
