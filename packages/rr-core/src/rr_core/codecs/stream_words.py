"""A payload's bit stream as aligned 64-bit words for the compiled decoders, without a copy.

Shape legend: P bytes of stream, Q whole words in it.

A compiled decoder reads field bits ``[b, b + width)`` from the little-endian word ``b >> 6`` and
the one after it. The stream's first ``Q = P // 8`` whole words are a view of the payload (when
it is 8-byte aligned, as the payloads rr writes and reads are; an unaligned one is copied once);
its last ``P % 8`` bytes, zero-padded, and two zero words after them form a separate 3-word tail,
so a read past the last whole word never leaves either array.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

_U64 = np.uint64


def stream_words(stream_P: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(words [Q], tail [3])``: uint64 views of the stream's whole words and its padded tail."""
    src = stream_P.contiguous().numpy()
    if src.ctypes.data % 8:
        src = src.copy()  # numpy allocates aligned
    whole = src.size // 8
    words = src[: 8 * whole].view(_U64)
    tail = np.zeros(3, dtype=_U64)
    tail.view(np.uint8)[: src.size - 8 * whole] = src[8 * whole :]
    return words, tail


def little_endian() -> bool:
    """The compiled decoders read words as little-endian, the stream's byte order."""
    return sys.byteorder == "little"
