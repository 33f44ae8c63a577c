"""Word-level (SWAR) row checks for byte ids: a top-K row of uint8 ids with K in {2, 4, 8} is one
machine word, so a row's flags come from a few integer operations on that word instead of
K(K-1)/2 byte comparisons.

- Repeat: the row repeats an id iff, for some cyclic distance d in 1..K/2, the word XOR the
  word rotated by d bytes has a zero byte. The bytewise minimum over the K/2 rotations has a
  zero byte iff one of them does (exact test: ``(y - 0x01..) & ~y & 0x80..`` is non-zero iff
  some byte of y is zero).
- Out of range: byte x >= E, per byte with no carry between bytes (``_high_bytes``).
- Non-zero: the word is non-zero.

Rows go through in chunks of ``CHUNK`` words so that the temporaries stay in cache, on
``torch.get_num_threads()`` threads. numpy makes some thirty passes over each chunk (about 0.1x
memcpy per core); where numba imports, :mod:`rr_core.routes.idcheck_numba` makes one, with the
same flags bit for bit (:mod:`rr_core.kernels` chooses).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rr_core import kernels
from rr_core.routes import idcheck_numba
from rr_core.threads import over_ranges

CHUNK = 1 << 15
WORDS: dict[int, type[np.unsignedinteger[Any]]] = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def covers(ids_RK: torch.Tensor) -> bool:
    """Whether :func:`word_flags` handles these rows."""
    cpu_bytes = ids_RK.dtype == torch.uint8 and ids_RK.device.type == "cpu"
    return cpu_bytes and ids_RK.shape[-1] in WORDS


def covers_narrowed(ids_RK: torch.Tensor) -> bool:
    """Whether wider integer ids, once narrowed to bytes, fit :func:`word_flags`."""
    wide = ids_RK.dtype in (torch.int16, torch.int32, torch.int64)
    return wide and ids_RK.device.type == "cpu" and ids_RK.shape[-1] in WORDS


def _every_byte(word: type[np.unsignedinteger[Any]], byte: int) -> np.unsignedinteger[Any]:
    return word(int.from_bytes(bytes([byte]) * np.dtype(word).itemsize, "little"))


def _high_bytes(w: np.ndarray, num_experts: int, tmp: np.ndarray) -> np.ndarray:
    """Words whose bytes are ``>= num_experts`` carry that byte's top bit in ``tmp``."""
    word = w.dtype.type
    high, low7 = _every_byte(word, 0x80), _every_byte(word, 0x7F)
    if num_experts >= 256:
        tmp.fill(0)
    elif num_experts <= 128:  # x >= E  <=>  top bit set, or (x & 0x7f) + 128 - E carries into it
        np.bitwise_and(w, low7, out=tmp)
        np.add(tmp, _every_byte(word, 128 - num_experts), out=tmp)
        np.bitwise_or(tmp, w, out=tmp)
    else:  # x >= E > 128  <=>  top bit set and (x & 0x7f) + 256 - E carries into bit 7
        np.bitwise_and(w, low7, out=tmp)
        np.add(tmp, _every_byte(word, 256 - num_experts), out=tmp)
        np.bitwise_and(tmp, w, out=tmp)
    np.bitwise_and(tmp, high, out=tmp)
    return tmp


def word_flags(ids_RK: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, ...]:
    """``(out_of_range_R, repeated_R, nonzero_R)`` of uint8 rows ``[..., K]``, K in {2, 4, 8}."""
    k = ids_RK.shape[-1]
    words = ids_RK.reshape(-1, k).contiguous().numpy().view(WORDS[k]).reshape(-1)
    flags = np.empty((3, words.size), dtype=bool)
    scan = idcheck_numba.scan if kernels.kernel() == "numba" else _scan
    over_ranges(words.size, CHUNK, lambda a, b: scan(words[a:b], num_experts, flags[:, a:b]))
    return tuple(torch.from_numpy(f) for f in flags)


def _scan(words: np.ndarray, num_experts: int, flags_3R: np.ndarray) -> None:
    """Fill ``flags_3R`` (out of range, repeated, non-zero) for ``words``, a chunk at a time."""
    word = words.dtype.type
    ones, high = _every_byte(word, 0x01), _every_byte(word, 0x80)
    bits = 8 * words.itemsize
    y, t, acc = (np.empty(min(words.size, CHUNK), dtype=word) for _ in range(3))
    for a in range(0, words.size, CHUNK):
        w = words[a : a + CHUNK]
        n = w.size
        yn, tn, an, bytes_an = y[:n], t[:n], acc[:n], acc[:n].view(np.uint8)
        bytes_an.fill(0xFF)
        for d in range(8, bits // 2 + 1, 8):  # rotate by d bits, XOR: a zero byte is a repeat
            np.right_shift(w, word(d), out=yn)
            np.left_shift(w, word(bits - d), out=tn)
            np.bitwise_or(yn, tn, out=yn)
            np.bitwise_xor(yn, w, out=yn)
            np.minimum(bytes_an, yn.view(np.uint8), out=bytes_an)
        np.subtract(an, ones, out=tn)  # the zero-byte test, once on the bytewise minimum
        np.bitwise_not(an, out=an)
        np.bitwise_and(an, tn, out=an)
        np.bitwise_and(an, high, out=an)
        np.not_equal(an, 0, out=flags_3R[1, a : a + n])
        np.not_equal(_high_bytes(w, num_experts, tn), 0, out=flags_3R[0, a : a + n])
        np.not_equal(w, 0, out=flags_3R[2, a : a + n])
