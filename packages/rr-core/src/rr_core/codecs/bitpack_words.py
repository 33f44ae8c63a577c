"""Fields of 32 to 56 bits packed on the CPU through unaligned 64-bit words, numpy only.

Shape legend: R fields, G groups of 8 fields (``width`` bytes each), P bytes of stream.

The stream is :func:`rr_core.codecs.bitpack.pack_fields`'s: field i occupies stream bits
``[i * width, (i + 1) * width)``, least significant bit first. Field i starts in byte
``o_i = i * width // 8`` at bit ``s_i = i * width % 8``, and 8 fields end on a byte boundary, so
both repeat every group. The little-endian word at byte ``o_i`` holds the top ``s_i`` bits of
field ``i - 1``, all of field ``i`` and the low bits of field ``i + 1`` (never field ``i + 2``, as
``2 * width >= 64``). Encoding writes that whole word, so the words of neighbouring fields overlap
with the same bytes and the order of the writes does not matter; decoding reads the word and
keeps field ``i``. Each block is a handful of numpy operations over ``[G, 8]`` arrays, one strided
column copy per position in a group.
"""

from __future__ import annotations

import sys
import threading
from functools import lru_cache

import numpy as np
import torch

from rr_core.buffers import recycled

BLOCK = 1 << 12  # groups per block: the temporaries stay in cache
_U64 = np.uint64


def covers(width: int, device: torch.device) -> bool:
    """Whether :func:`pack_words` and :func:`unpack_words` handle this width on this device."""
    return 32 <= width <= 56 and device.type == "cpu" and sys.byteorder == "little"


def _words(buf: np.ndarray, groups: int, width: int) -> list[np.ndarray]:
    """Unaligned views of the word at byte ``o_j`` of every group: one ``[G, 8]`` view when the
    ``o_j`` are evenly spaced (``width % 8 <= 1``), else one ``[G]`` view per position j."""
    if not groups:
        return [np.empty((0, 8), dtype=_U64)]
    if width % 8 <= 1:
        step = width // 8
        return [np.ndarray((groups, 8), dtype=_U64, buffer=buf, strides=(width, step))]
    return [
        np.ndarray((groups, 1), dtype=_U64, buffer=buf, offset=width * j // 8, strides=(width, 8))
        for j in range(8)
    ]


@lru_cache(maxsize=16)
def _shifts(width: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shift counts ``s_i``, ``width - s_i``, ``width + s_i`` for ``8 * rows`` fields, spelled
    out in full: numpy shifts a whole array by an array far faster than by a broadcast row."""
    s = np.tile(np.array([width * j % 8 for j in range(8)], dtype=_U64), rows)
    return s, _U64(width) - s, _U64(width) + s


class WordPacker:
    """Writes the stream of ``count`` fields block by block.

    A block's last word holds the low bits of the field after it: ``following``, or zero, which
    the next block's first word (at bit 0 of its byte) then rewrites. Blocks given their
    ``following`` field may be written in any order and from several threads (each thread has
    its own scratch; overlapping words carry the same bytes); the others must come in order.
    """

    def __init__(self, count: int, width: int, block: int = 8 * BLOCK) -> None:
        G = -(-count // 8)
        self.count, self.width, self.block = count, width, -(-block // 8) * 8
        self.buf = recycled((G * width + 8,), np.dtype(np.uint8))  # the last word spills 8 bytes on
        self.words = _words(self.buf, G, width)
        self.shifts = _shifts(width, self.block // 8)
        self._scratch = threading.local()

    def put(self, first: int, fields: np.ndarray, following: int = 0) -> None:
        """Fields ``[first, first + len)`` (uint64, ``first`` a multiple of 8; only the last
        block may end off a group), then field ``first + len`` is ``following``."""
        for a in range(0, fields.size, self.block):
            last = a + self.block >= fields.size
            nxt = following if last else int(fields[a + self.block])
            self._put(first + a, fields[a : a + self.block], nxt)

    def _put(self, first: int, fields: np.ndarray, following: int) -> None:
        s_X, down_X, up_X = self.shifts
        if not hasattr(self._scratch, "acc"):
            self._scratch.acc = np.empty(self.block, dtype=_U64)
            self._scratch.tmp = np.empty(self.block, dtype=_U64)
        m = fields.size
        n = -(-m // 8)
        x, t = self._scratch.acc[: 8 * n], self._scratch.tmp[: 8 * n]
        np.left_shift(fields, s_X[:m], out=x[:m])
        x[m:] = 0
        k = min(m + 1, 8 * n)  # the top bits of field i - 1 (none at i = 0 of a group: s = 0)
        np.right_shift(fields[: k - 1], down_X[1:k], out=t[1:k])
        x[1:k] |= t[1:k]
        np.left_shift(fields[1:], up_X[: m - 1], out=t[: m - 1])  # the low bits of field i + 1
        x[: m - 1] |= t[: m - 1]
        if following and m % 8 == 0:  # the last word reaches into the next group's first field
            x[m - 1] |= np.left_shift(_U64(following), up_X[m - 1])
        a, x_B8 = first // 8, x.reshape(n, 8)
        if len(self.words) == 1:
            np.copyto(self.words[0][a : a + n], x_B8)
            return
        for j, col in enumerate(self.words):
            np.copyto(col[a : a + n], x_B8[:, j : j + 1])

    def stream(self) -> torch.Tensor:
        return torch.from_numpy(self.buf[: -(-self.count * self.width // 8)])


def pack_words(fields_R: torch.Tensor, width: int) -> torch.Tensor:
    """The stream (uint8 ``[P]``) of int64 fields ``[R]`` below ``2**width``."""
    R = fields_R.numel()
    f = fields_R.contiguous().numpy().view(_U64)
    packer = WordPacker(R, width)
    packer.put(0, f)
    return packer.stream()


class WordUnpacker:
    """Reads the fields of a stream block by block, in any order."""

    def __init__(self, stream_P: torch.Tensor, count: int, width: int) -> None:
        need = -(-count * width // 8)
        if stream_P.numel() != need:
            raise ValueError(
                f"a stream of {count} {width}-bit fields has {need} bytes, not {stream_P.numel()}"
            )
        G = -(-count // 8)
        src = stream_P.contiguous().numpy()
        self.inside = max(0, min(G, (need - 8 - width * 7 // 8) // width + 1))  # in the stream
        tail = np.zeros((G - self.inside) * width + 8, dtype=np.uint8)
        tail[: need - self.inside * width] = src[self.inside * width :]
        self.parts = (_words(src, self.inside, width), _words(tail, G - self.inside, width))
        self.width, self.shifts = width, _shifts(width, BLOCK)[0].reshape(BLOCK, 8)

    def get(self, first: int, out: np.ndarray) -> None:
        """Fields ``[first, first + len(out))`` into ``out`` (uint64, ``first`` a multiple of 8,
        ``len(out)`` a multiple of 8 too unless the stream ends there)."""
        mask = _U64((1 << self.width) - 1)
        end = -(-out.size // 8) * 8
        a = 0
        while a < end:
            g = (first + a) // 8
            inside = g < self.inside
            n = min(BLOCK, (self.inside - g) if inside else (end - a) // 8, (end - a) // 8)
            words = self.parts[0] if inside else self.parts[1]
            at = g if inside else g - self.inside
            partial = a + 8 * n > out.size  # the stream's last group, not whole
            y = np.empty(8 * n, dtype=_U64) if partial else out[a : a + 8 * n]
            y_B8 = y.reshape(n, 8)
            for j, w_G in enumerate(words):
                cols = slice(None) if len(words) == 1 else slice(j, j + 1)
                np.right_shift(w_G[at : at + n], self.shifts[:n, cols], out=y_B8[:, cols])
            y &= mask
            if partial:
                out[a:] = y[: out.size - a]
            a += 8 * n


def unpack_words(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_words`: int64 fields ``[count]``."""
    out = np.empty(count, dtype=_U64)
    WordUnpacker(stream_P, count, width).get(0, out)
    return torch.from_numpy(out.view(np.int64))
