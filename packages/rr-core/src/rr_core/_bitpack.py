"""Fixed-width bit fields packed into a byte stream, vectorised on any torch device.

Shape legend: R fields, W 32-bit limbs per field (least significant first), G groups of fields
that fill a whole number of 32-bit words, J fields per group, P bytes of stream.

A field is ``width`` bits wide; field r occupies stream bits ``[r * width, (r + 1) * width)``,
least significant bit first, bytes little-endian. Fields arrive and leave as 32-bit limbs held in
int64 so that every shift stays inside int64 without a sign bit on any device (torch has no
portable uint64 shifts). Loops run over the fields of one group and their limbs, never over rows.
"""

from __future__ import annotations

import math

import torch

MASK32 = (1 << 32) - 1


def limbs_for(width: int) -> int:
    """How many 32-bit limbs hold a field of ``width`` bits."""
    return max(1, -(-width // 32))


def stream_bytes(count: int, width: int) -> int:
    """Bytes of a stream of ``count`` fields of ``width`` bits."""
    return -(-count * width // 8)


def _group(width: int) -> tuple[int, int]:
    """``(fields, words)`` of the smallest group of fields ending on a 32-bit word boundary."""
    fields = 32 // math.gcd(width, 32)
    return fields, fields * width // 32


def _chunks(width: int) -> list[tuple[int, int, int, int, int]]:
    """``(field, limb, word, shift, bits)`` of every limb of every field in one group."""
    fields, _ = _group(width)
    out = []
    for j in range(fields):
        for limb in range(limbs_for(width)):
            bits = min(32, width - 32 * limb)
            word, shift = divmod(j * width + 32 * limb, 32)
            out.append((j, limb, word, shift, bits))
    return out


def pack_bits(limbs_RW: torch.Tensor, width: int) -> torch.Tensor:
    """The stream (uint8 ``[P]``) of ``R`` fields given as int64 limbs ``[R, W]``.

    Every limb must already be below ``2**32`` (the top one below its share of ``width``); bits
    above the field width would corrupt the neighbouring field, so callers check their range.
    """
    R = limbs_RW.shape[0]
    dev = limbs_RW.device
    if width == 0 or R == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev)
    fields, words = _group(width)
    G = -(-R // fields)
    if G * fields != R:
        pad = limbs_RW.new_zeros((G * fields - R, limbs_RW.shape[1]))
        limbs_RW = torch.cat([limbs_RW, pad])
    # Field-major copy: each chunk below is then a contiguous row, not a strided column.
    limbs_JWG = limbs_RW.reshape(G, fields, -1).permute(1, 2, 0).contiguous()
    words_WG = torch.zeros((words, G), dtype=torch.int64, device=dev)
    tmp_G = torch.empty(G, dtype=torch.int64, device=dev)  # reused: no allocation per chunk
    for j, limb, word, shift, bits in _chunks(width):
        chunk_G = limbs_JWG[j, limb]
        if shift == 0:
            words_WG[word] |= chunk_G
            continue
        torch.bitwise_left_shift(chunk_G, shift, out=tmp_G)
        tmp_G &= MASK32
        words_WG[word] |= tmp_G
        if shift + bits > 32:
            torch.bitwise_right_shift(chunk_G, 32 - shift, out=tmp_G)
            words_WG[word + 1] |= tmp_G
    words_GW = words_WG.t()
    # int64 holding uint32 -> int32 with the same bits, explicitly (no reliance on wrap-around).
    signed_GW = (words_GW - ((words_GW >> 31) << 32)).to(torch.int32)
    return signed_GW.reshape(-1).view(torch.uint8)[: stream_bytes(R, width)]


def unpack_bits(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: int64 limbs ``[count, W]`` on the stream's device."""
    dev = stream_P.device
    nl = limbs_for(width)
    if width == 0 or count == 0:
        return torch.zeros((count, nl), dtype=torch.int64, device=dev)
    need = stream_bytes(count, width)
    if stream_P.numel() != need:
        raise ValueError(
            f"a stream of {count} {width}-bit fields has {need} bytes, not {stream_P.numel()}"
        )
    fields, words = _group(width)
    G = -(-count // fields)
    full = torch.zeros(G * words * 4, dtype=torch.uint8, device=dev)
    full[:need] = stream_P
    words_WG = full.view(torch.int32).reshape(G, words).t().contiguous().to(torch.int64) & MASK32
    out_JWG = torch.empty((fields, nl, G), dtype=torch.int64, device=dev)
    tmp_G = torch.empty(G, dtype=torch.int64, device=dev)  # reused: no allocation per chunk
    for j, limb, word, shift, bits in _chunks(width):
        chunk_G = out_JWG[j, limb]
        torch.bitwise_right_shift(words_WG[word], shift, out=chunk_G)
        if shift + bits > 32:
            torch.bitwise_left_shift(words_WG[word + 1], 32 - shift, out=tmp_G)
            chunk_G |= tmp_G
        chunk_G &= (1 << bits) - 1
    return out_JWG.permute(2, 0, 1).reshape(G * fields, nl)[:count]


# Byte lanes merged pairwise: (right shift, lane mask) of each level, from 8-bit to 64-bit lanes.
_LEVELS = ((8, 0x00FF00FF00FF00FF), (16, 0x0000FFFF0000FFFF), (32, 0x00000000FFFFFFFF))


def pack_bytes(ids_n: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`pack_bits` for uint8 ids of ``width <= 7`` bits, in a few whole-array passes.

    Eight ids are one int64 word; three rounds of shift-and-merge squeeze the eight byte lanes
    into the low ``8 * width`` bits, whose ``width`` low bytes are the stream of that group.
    """
    n = ids_n.numel()
    G = -(-n // 8)
    padded = ids_n if n == G * 8 else torch.cat([ids_n, ids_n.new_zeros(G * 8 - n)])
    x_G = padded.contiguous().view(torch.int64)
    lane = width
    for shift, mask in _LEVELS:
        hi_G = x_G >> shift
        hi_G &= mask
        hi_G <<= lane
        x_G = x_G & mask
        x_G |= hi_G
        lane *= 2
    return x_G.view(torch.uint8).reshape(G, 8)[:, :width].reshape(-1)[: stream_bytes(n, width)]


def unpack_bytes(stream_P: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_bytes`: uint8 ids ``[count]`` on the stream's device."""
    if stream_P.numel() != stream_bytes(count, width):
        raise ValueError(
            f"a stream of {count} {width}-bit fields has {stream_bytes(count, width)} bytes, "
            f"not {stream_P.numel()}"
        )
    G = -(-count // 8)
    head_P = torch.zeros(G * width, dtype=torch.uint8, device=stream_P.device)
    head_P[: stream_P.numel()] = stream_P
    full_G8 = torch.zeros((G, 8), dtype=torch.uint8, device=stream_P.device)
    full_G8[:, :width] = head_P.view(G, width)
    x_G = full_G8.view(torch.int64).reshape(G)
    lane = 4 * width
    for shift, _ in reversed(_LEVELS):
        field = (1 << lane) - 1
        keep = sum(field << (2 * shift * i) for i in range(32 // shift))
        hi_G = x_G >> lane
        hi_G &= keep
        hi_G <<= shift
        x_G = x_G & keep
        x_G |= hi_G
        lane //= 2
    return x_G.view(torch.uint8)[:count]
