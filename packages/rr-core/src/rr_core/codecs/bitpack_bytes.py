"""Ids of at most 7 bits held in uint8, eight to a group of ``width`` bytes.

Shape legend: n ids, G whole groups of 8 ids, P bytes of stream.

Group layout (w = ``width``, ids b_0 .. b_7 of the group): byte i < w holds b_i in its low w bits
and, in bit w + j, bit i of b_{w + j} (j < 8 - w). A trailing partial group of r < 8 ids is a plain
LSB-first bit stream of ``ceil(r * w / 8)`` bytes (:func:`pack_bits`), so n ids take
``ceil(n * w / 8)`` bytes and streams of whole groups concatenate.

On the CPU a group is one uint64 word of the ids (numpy: shifts are logical and products wrap, as
the bit tricks below need). The stream is read and written through a view of 8-byte words every
w bytes: encoding writes the words in ascending order, each word's bytes past w are overwritten
by the next group, and the last group's spill lands in padding cut off at the end. Decoding
splits the groups across threads; with numba it runs the compiled blocks of
:mod:`rr_core.codecs.decode_numba`. On other devices plain torch byte operations produce the
same stream.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from rr_core import kernels
from rr_core.buffers import empty
from rr_core.codecs.bitpack import pack_bits, stream_bytes, unpack_bits
from rr_core.codecs.stream_words import little_endian
from rr_core.threads import over_ranges

BLOCK = 1 << 15  # words per block: the temporaries stay in cache
_U64 = np.uint64


def _spread(width: int, j: int) -> tuple[int, int, int]:
    """``(shift, multiplier, mask)`` that move id ``w + j`` of a word into its spare bits."""
    w = width
    mult = sum(1 << (7 * i + w + j) for i in range(w))  # copies 7 apart: no carries
    mask = sum(1 << (8 * i + w + j) for i in range(w))
    return 8 * (w + j), mult, mask


def _gather(width: int, j: int) -> tuple[int, int, int]:
    """``(mask, multiplier, byte mask)`` that collect id ``w + j`` back into byte ``w + j``.

    Bit ``8 i + w + j`` times ``2 ** (7 (w + j - k))`` lands on ``8 (w + j) + 8 i - 7 k``: distinct
    for every (i, k), so nothing carries, and only i = k lands inside byte ``w + j``.
    """
    w = width
    mask = sum(1 << (8 * i + w + j) for i in range(w))
    mult = sum(1 << (7 * (w + j - i)) for i in range(w))
    return mask, mult, 0xFF << (8 * (w + j))


def pack_byte_ids(ids_n: torch.Tensor, width: int) -> torch.Tensor:
    """The stream (uint8 ``[P]``) of uint8 ids ``[n]`` below ``2**width``, ``1 <= width <= 7``."""
    n, dev = ids_n.numel(), ids_n.device
    G, w = n // 8, width
    out = empty(G * w + stream_bytes(n - 8 * G, w) + 8, torch.uint8, dev)
    if G:
        words = ids_n[: 8 * G].contiguous()
        if dev.type == "cpu" and _numpy_path_exact(w):
            _encode_np(words.numpy().view(_U64), out.numpy(), w)
        else:
            out[: G * w] = _encode_torch(words.view(G, 8), w).reshape(-1)
    tail = stream_bytes(n - 8 * G, w)
    if tail:
        out[G * w : G * w + tail] = pack_bits(ids_n[8 * G :].to(torch.int64)[:, None], w)
    return out[: G * w + tail]


def unpack_byte_ids(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_byte_ids`: uint8 ids ``[count]`` on the stream's device."""
    w, dev = width, stream_P.device
    need = stream_bytes(count, w)
    if stream_P.numel() != need:
        raise ValueError(
            f"a stream of {count} {w}-bit fields has {need} bytes, not {stream_P.numel()}"
        )
    G = count // 8
    out = empty(count, torch.uint8, dev)
    fast = 0
    if dev.type == "cpu" and kernels.kernel() == "numba" and little_endian():
        from rr_core.codecs.decode_numba import unpack_byte_blocks

        fast = unpack_byte_blocks(stream_P, G, w, out[: 8 * G].numpy().view(_U64))
    elif dev.type == "cpu" and need >= 8:  # words that end inside the stream
        fast = min(G, (need - 8) // w + 1)
        src, dst = stream_P.contiguous().numpy(), out[: 8 * fast].numpy().view(_U64)
        over_ranges(fast, BLOCK, lambda a, b: _decode_np(src[a * w :], dst[a:b], w))
    if fast < G:
        bytes_Gw = stream_P[fast * w : G * w].reshape(-1, w)
        out[8 * fast : 8 * G] = _decode_torch(bytes_Gw, w).reshape(-1)
    if count > 8 * G:
        limbs = unpack_bits(stream_P[G * w :], count - 8 * G, w)
        out[8 * G :] = limbs[:, 0].to(torch.uint8)
    return out


@functools.cache
def _numpy_path_exact(width: int) -> bool:
    """Does the word path write what the reference layout says? It relies on numpy storing an
    overlapping strided output in ascending order, which numpy does but does not document: check
    once per width (a few blocks' worth) and fall back to the torch path if it ever changes."""
    g = torch.Generator().manual_seed(width)
    ids_G8 = torch.randint(0, 1 << width, (2 * BLOCK + 3, 8), generator=g, dtype=torch.uint8)
    buf = torch.zeros(ids_G8.shape[0] * width + 8, dtype=torch.uint8)
    _encode_np(ids_G8.reshape(-1).numpy().view(_U64), buf.numpy(), width)
    return torch.equal(buf[: ids_G8.shape[0] * width], _encode_torch(ids_G8, width).reshape(-1))


def _encode_np(x_G: np.ndarray, buf: np.ndarray, width: int) -> None:
    G, w = x_G.size, width
    dst_G = np.ndarray((G,), dtype=_U64, buffer=buf, strides=(w,))  # overlapping, unaligned
    terms = [_spread(w, j) for j in range(8 - w)]
    tmp, acc = np.empty(BLOCK, dtype=_U64), np.empty(BLOCK, dtype=_U64)
    for a in range(0, G, BLOCK):
        x, dst = x_G[a : a + BLOCK], dst_G[a : a + BLOCK]
        t, s = tmp[: x.size], acc[: x.size]
        for k, (shift, mult, mask) in enumerate(terms):
            np.right_shift(x, _U64(shift), out=t)
            if shift < 56:  # later ids sit above: keep this one only
                t &= _U64((1 << w) - 1)
            t *= _U64(mult)
            t &= _U64(mask)
            last = k == len(terms) - 1
            target = dst if last else s  # the last term writes the stream directly
            np.bitwise_or(x if k == 0 else s, t, out=target)


def _decode_np(src_P: np.ndarray, out_G: np.ndarray, width: int) -> None:
    G, w = out_G.size, width
    src_G = np.ndarray((G,), dtype=_U64, buffer=src_P, strides=(w,))  # overlapping, unaligned
    low = _U64(sum(((1 << w) - 1) << (8 * i) for i in range(w)))
    terms = [tuple(_U64(v) for v in _gather(w, j)) for j in range(8 - w)]
    tmp, words = np.empty(BLOCK, dtype=_U64), np.empty(BLOCK, dtype=_U64)
    for a in range(0, G, BLOCK):
        out = out_G[a : a + BLOCK]
        t, src = tmp[: out.size], words[: out.size]
        np.copyto(src, src_G[a : a + BLOCK])  # one unaligned read per block
        np.bitwise_and(src, low, out=out)
        for mask, mult, byte in terms:
            np.bitwise_and(src, mask, out=t)
            t *= mult  # wraps modulo 2**64; the bits kept never carry
            t &= byte
            out |= t


def _encode_torch(ids_G8: torch.Tensor, width: int) -> torch.Tensor:
    """Groups ``[G, 8]`` to bytes ``[G, w]`` (the reference layout, any device)."""
    w, dev = width, ids_G8.device
    bits_w = torch.arange(w, dtype=torch.uint8, device=dev)
    to_j = torch.arange(w, 8, dtype=torch.uint8, device=dev)
    spare_GWJ = ((ids_G8[:, None, w:] >> bits_w[None, :, None]) & 1) << to_j
    return ids_G8[:, :w] | spare_GWJ.sum(dim=2, dtype=torch.uint8)  # disjoint bits: sum = or


def _decode_torch(bytes_Gw: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`_encode_torch`: ids ``[G, 8]``."""
    w, dev = width, bytes_Gw.device
    bits_w = torch.arange(w, dtype=torch.uint8, device=dev)
    from_j = torch.arange(w, 8, dtype=torch.uint8, device=dev)
    spare_GWJ = ((bytes_Gw[:, :, None] >> from_j) & 1) << bits_w[None, :, None]
    extra_GJ = spare_GWJ.sum(dim=1, dtype=torch.uint8)
    return torch.cat([bytes_Gw & ((1 << w) - 1), extra_GJ], dim=1)
