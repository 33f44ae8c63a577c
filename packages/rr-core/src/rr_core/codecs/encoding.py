"""Route codecs: the recorded ids of a :class:`RouteBatch` in as few bytes as they need.

Shape legend: N rows, V valid rows, L slots on the layer axis, M MoE slots, K top-k, B sequences,
P payload bytes, R (token, MoE layer) pairs.

Only the MoE slots of valid rows are stored: dense slots hold zeros by contract and invalid rows
hold no route, so both decode as zeros and cost nothing but the validity mask (one bit per row).

- ``raw``: the narrowest exact dtype (uint8 up to 256 experts, int16 above), order preserved.
- ``packed``: ``ceil(log2 E)`` bits per id, order preserved. The default.
- ``set``: each top-k set as its rank in the combinatorial number system, ``ceil(log2 C(E, K))``
  bits per (token, MoE layer). The order of the K ids is lost; decoding sorts them. Safe only for
  consumers that use the ids as a set, such as Megatron's routing map and probability scatter.

Encoding and decoding are whole-tensor torch operations on the batch's device (no loop over rows);
:func:`decode_routes` moves the compact payload to ``device`` first, so the expanded ids only ever
exist where they are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rr_core import kernels
from rr_core.codecs import sets_numba
from rr_core.codecs.bitpack import (
    pack_bits,
    pack_fields,
    pack_ids,
    stream_bytes,
    unpack_bits,
    unpack_fields,
    unpack_ids,
)
from rr_core.codecs.bitpack_bytes import pack_byte_ids, unpack_byte_ids
from rr_core.codecs.bitpack_words import WordPacker, WordUnpacker, covers, pack_words, unpack_words
from rr_core.codecs.rows import pack_valid_cpu, valid_rows
from rr_core.codecs.sets import rank_sets, set_width, single_rank, unrank_sets, unrank_single
from rr_core.codecs.sets_fast import fast_shape, rank_fast, unrank_fast, unrank_from
from rr_core.errors import CodecError
from rr_core.routes.batch import RouteBatch, RouteMeta, narrowest_dtype

CodecName = Literal["raw", "packed", "set"]
CODECS: tuple[CodecName, ...] = ("raw", "packed", "set")
DEFAULT_CODEC: CodecName = "packed"


def check_codec(name: str) -> CodecName:
    """``name`` as a codec name, or :class:`CodecError` listing the codecs."""
    if not isinstance(name, str) or name not in CODECS:
        raise CodecError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return name  # type narrowed by the membership test


def id_width(num_experts: int) -> int:
    """Bits per expert id in the ``packed`` codec: ``ceil(log2 E)``."""
    return (num_experts - 1).bit_length()


def field_bits(meta: RouteMeta, codec: str) -> int:
    """Bits that one (token, MoE layer) pair costs under ``codec``."""
    E, K = meta.num_experts, meta.top_k
    codec = check_codec(codec)
    if codec == "raw":
        return K * 8 * narrowest_dtype(E).itemsize
    if codec == "packed":
        return K * id_width(E)
    return set_width(E, K)


def bytes_per_token(meta: RouteMeta, codec: str) -> float:
    """Route bytes of one valid token row under ``codec`` (MoE slots only). The validity mask
    adds 1/8 byte per row, valid or not; invalid rows cost nothing else."""
    return len(meta.moe_slots) * field_bits(meta, codec) / 8


@dataclass(frozen=True, kw_only=True)
class EncodedRoutes:
    """A route batch in codec form: ``payload`` (uint8 ``[P]``) holds the MoE slots of the valid
    rows, ``valid_bits`` the validity mask (row n is bit ``n % 8`` of byte ``n // 8``)."""

    codec: CodecName
    meta: RouteMeta
    num_rows: int
    offsets_B1: torch.Tensor
    valid_bits: torch.Tensor
    payload: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Bytes of payload, validity mask and offsets together."""
        return self.payload.numel() + self.valid_bits.numel() + 8 * self.offsets_B1.numel()

    @property
    def bytes_per_token(self) -> float:
        """Measured payload plus validity bytes per row (0 for an empty batch)."""
        total = self.payload.numel() + self.valid_bits.numel()
        return total / self.num_rows if self.num_rows else 0.0


def pack_valid(valid_N: torch.Tensor) -> torch.Tensor:
    """The validity mask as uint8 bits, little bit order."""
    if (bits := pack_valid_cpu(valid_N.reshape(-1))) is not None:
        return bits
    N = valid_N.numel()
    padded = torch.zeros(-(-N // 8) * 8, dtype=torch.uint8, device=valid_N.device)
    padded[:N] = valid_N
    weights_8 = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=padded.device)
    return (padded.view(-1, 8) * weights_8).sum(dim=1, dtype=torch.uint8)


def unpack_valid(bits: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Inverse of :func:`pack_valid`: bool ``[num_rows]``."""
    if bits.numel() != -(-num_rows // 8):
        raise CodecError(
            f"a validity mask of {num_rows} rows has {-(-num_rows // 8)} bytes, not {bits.numel()}"
        )
    shifts_8 = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits[:, None] >> shifts_8) & 1).bool().reshape(-1)[:num_rows]


def payload_bytes(meta: RouteMeta, codec: str, num_valid: int) -> int:
    """Exact payload size of ``num_valid`` valid rows."""
    pairs = num_valid * len(meta.moe_slots)
    codec = check_codec(codec)
    if codec == "raw":
        return pairs * meta.top_k * narrowest_dtype(meta.num_experts).itemsize
    return stream_bytes(pairs, field_bits(meta, codec))


def encode_routes(batch: RouteBatch, codec: str = DEFAULT_CODEC) -> EncodedRoutes:
    """Encode ``batch`` with ``codec``. Ids outside ``[0, E)`` on valid MoE slots raise, and so do
    repeated ids under ``set``: a payload is exact or it is not written."""
    name, meta = check_codec(codec), batch.meta
    values_NLK = batch.values_NLK
    moe = meta.moe_slots
    if len(moe) != values_NLK.shape[1]:
        values_NLK = values_NLK.index_select(1, torch.tensor(moe, device=values_NLK.device))
    all_valid = bool(batch.valid_N.all())
    rows_VMK = values_NLK if all_valid else valid_rows(values_NLK, batch.valid_N)
    if rows_VMK.numel():
        lo, hi = (int(v) for v in torch.aminmax(rows_VMK))
        if lo < 0 or hi >= meta.num_experts:
            raise CodecError(
                f"expert ids span [{lo}, {hi}] on valid rows; codec {name!r} holds ids in "
                f"[0, {meta.num_experts}) for num_experts={meta.num_experts}"
            )
    return EncodedRoutes(
        codec=name,
        meta=meta,
        num_rows=batch.num_tokens,
        offsets_B1=batch.offsets_B1,
        valid_bits=pack_valid(batch.valid_N),
        payload=encode_payload(rows_VMK, name, meta),
    )


def encode_payload(rows_VMK: torch.Tensor, codec: CodecName, meta: RouteMeta) -> torch.Tensor:
    """The payload bytes of valid rows' MoE slots ``[V, M, K]``. Payloads of row blocks whose
    field count is a multiple of 8 concatenate into the payload of all rows (whole bytes)."""
    E, K = meta.num_experts, meta.top_k
    flat = rows_VMK.contiguous().reshape(-1)
    width = id_width(E)
    if codec == "raw" or (codec == "packed" and width == 8 * flat.element_size()):
        return flat.view(torch.uint8)
    if codec == "packed":
        if 0 < width < 8:  # ids below 2**7 take byte groups, whatever dtype holds them
            return pack_byte_ids(flat.to(torch.uint8), width)
        if flat.element_size() <= 2:
            return pack_ids(flat, width)
        return pack_fields(flat.to(torch.int64), width)
    ids_RK, width = flat.reshape(-1, K), set_width(E, K)
    if fast_shape(E, K, ids_RK.dtype, ids_RK.device) and ids_RK.shape[0] and width:
        # None: a repeated id, which the general path reports
        if kernels.kernel() == "numba":  # ranks and packs in one compiled pass
            if (stream := sets_numba.rank_pack(ids_RK, E, width)) is not None:
                return stream
        elif covers(width, ids_RK.device):  # each block of ranks is packed while in cache
            packer = WordPacker(ids_RK.shape[0], width)
            if rank_fast(ids_RK, E, packer.put) is not None:
                return packer.stream()
        elif (ranks_R := rank_fast(ids_RK, E)) is not None:
            return pack_fields(ranks_R, width)
    if single_rank(E, K) and width:  # one int64 field per set
        return _pack_ranks(rank_sets(ids_RK, E, single_out=True), width)
    return pack_bits(rank_sets(ids_RK, E), width)


def _pack_ranks(ranks_R: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`pack_fields` of int64 set ranks, through 64-bit words where they cover the width."""
    if covers(width, ranks_R.device):
        return pack_words(ranks_R, width)
    return pack_fields(ranks_R, width)


def _unpack_ranks(payload: torch.Tensor, pairs: int, width: int) -> torch.Tensor:
    """Inverse of :func:`_pack_ranks`: int64 ranks ``[pairs]``."""
    if covers(width, payload.device):
        return unpack_words(payload, pairs, width)
    return unpack_fields(payload, pairs, width)


def decode_routes(
    encoded: EncodedRoutes, *, device: torch.device | str | None = None
) -> RouteBatch:
    """The route batch of ``encoded`` on ``device`` (default: the payload's). Only the payload
    crosses to the device; the ids are expanded there in the narrowest dtype. Under ``set`` the
    ids of each (token, layer) come back sorted."""
    meta, name = encoded.meta, check_codec(encoded.codec)
    dev = encoded.payload.device if device is None else torch.device(device)
    valid_N = unpack_valid(encoded.valid_bits.to(dev), encoded.num_rows)
    V, M, K = int(valid_N.sum()), len(meta.moe_slots), meta.top_k
    payload = encoded.payload.to(dev)
    expected = payload_bytes(meta, name, V)
    if payload.numel() != expected:
        raise CodecError(
            f"a {name!r} payload of {V} valid rows x {M} MoE layers has {expected} bytes, not "
            f"{payload.numel()}"
        )
    rows_VMK = _decode_payload(payload, name, meta, V * M).reshape(V, M, K)
    N, L = encoded.num_rows, len(meta.layer_numbers)
    if V == N and M == L:
        values_NLK = rows_VMK
    else:
        values_NLK = rows_VMK.new_zeros((N, L, K))
        slots = torch.tensor(meta.moe_slots, device=dev)
        rows_N = valid_N.nonzero()[:, 0]
        values_NLK[rows_N[:, None], slots[None, :]] = rows_VMK
    offsets_B1 = encoded.offsets_B1.to(dev)
    return RouteBatch(values_NLK, offsets_B1, valid_N, meta, validate=False)


def _decode_payload(
    payload: torch.Tensor, codec: CodecName, meta: RouteMeta, pairs: int
) -> torch.Tensor:
    """Ids ``[pairs * K]`` in the narrowest dtype."""
    E, K = meta.num_experts, meta.top_k
    dtype = narrowest_dtype(E)
    width = id_width(E)
    if codec == "raw" or (codec == "packed" and width == 8 * dtype.itemsize):
        ids = payload.contiguous().clone().view(dtype) if dtype != torch.uint8 else payload
    elif codec == "packed":
        if 0 < width < 8:
            ids = unpack_byte_ids(payload, pairs * K, width)
        elif dtype.itemsize <= 2:
            ids = unpack_ids(payload, pairs * K, width, dtype)
        else:
            ids = unpack_fields(payload, pairs * K, width).to(dtype)
        if 1 << width == E:  # every field value is an id: nothing to check
            return ids
    else:
        width = set_width(E, K)
        if fast_shape(E, K, dtype, payload.device) and pairs and width:
            if covers(width, payload.device):  # each block of ranks is unpacked into cache
                fast = unrank_from(pairs, E, WordUnpacker(payload, pairs, width).get)
            else:
                fast = unrank_fast(unpack_fields(payload, pairs, width), E)
            if fast is None:
                raise CodecError(f"a set rank is >= C({E}, {K}); the payload is corrupt")
            return fast.reshape(-1)
        if single_rank(E, K) and width:
            ids_RK = unrank_single(_unpack_ranks(payload, pairs, width), E, K)
        else:
            ids_RK = unrank_sets(unpack_bits(payload, pairs, width), E, K)
        return ids_RK.to(dtype).reshape(-1)
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= E:
            raise CodecError(
                f"decoded ids span [{lo}, {hi}], outside [0, {E}); the {codec!r} payload is corrupt"
            )
    return ids
