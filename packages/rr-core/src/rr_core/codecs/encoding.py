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
exist where they are used. :func:`decode_routes_into` writes them into a caller's layout instead
(its buffer, dtype and row of each valid row), where the ``set`` codec's compiled decoder writes
each id once, straight into place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rr_core import kernels
from rr_core.buffers import empty, zeros
from rr_core.checks import as_index, describe
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
from rr_core.codecs.decode_numba import unrank_into
from rr_core.codecs.payload import payload_as_bytes
from rr_core.codecs.rows import (
    count_valid,
    pack_valid_cpu,
    unpack_valid_cpu,
    valid_indices,
    valid_rows,
)
from rr_core.codecs.scatter import scatter_rows
from rr_core.codecs.sets import rank_sets, set_width, single_rank, unrank_sets, unrank_single
from rr_core.codecs.sets_fast import fast_shape, rank_fast, unrank_fast, unrank_from
from rr_core.codecs.stream_words import little_endian
from rr_core.errors import CodecError
from rr_core.routes.batch import RouteBatch
from rr_core.routes.id_dtypes import holds_ids, narrowest_dtype
from rr_core.routes.meta import RouteMeta

CodecName = Literal["raw", "packed", "set"]
CODECS: tuple[CodecName, ...] = ("raw", "packed", "set")
DEFAULT_CODEC: CodecName = "packed"


def check_codec(name: str) -> CodecName:
    """``name`` as a codec name, or :class:`CodecError` listing the codecs."""
    if not isinstance(name, str) or name not in CODECS:
        raise CodecError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return name  # type narrowed by the membership test


def _check_arg(value: object, kind: type, what: str) -> None:
    """:class:`CodecError` unless ``value`` is a ``kind`` (the public entry points' argument)."""
    if not isinstance(value, kind):
        raise CodecError(f"{what} must be a {kind.__name__}; got {type(value).__name__}")


def id_width(num_experts: int) -> int:
    """Bits per expert id in the ``packed`` codec: ``ceil(log2 E)``."""
    return (num_experts - 1).bit_length()


def field_bits(meta: RouteMeta, codec: str) -> int:
    """Bits that one (token, MoE layer) pair costs under ``codec``."""
    _check_arg(meta, RouteMeta, "meta")
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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its CPU tensors as numpy arrays: torch pickles each tensor through an
        in-memory archive (about 250 bytes more per tensor, which counts when every sample of
        a batch is pickled alone), and Ray ships numpy arrays out of band without a copy."""
        tensors = (self.offsets_B1, self.valid_bits, self.payload)
        if any(t.device.type != "cpu" for t in tensors):
            return (_rebuild_encoded, (self.codec, self.meta, self.num_rows, *tensors))
        arrays = tuple(t.numpy() for t in tensors)
        return (_rebuild_encoded, (self.codec, self.meta, self.num_rows, *arrays))


def _rebuild_encoded(
    codec: CodecName, meta: RouteMeta, num_rows: int, *fields: torch.Tensor | np.ndarray
) -> EncodedRoutes:
    offsets_B1, valid_bits, payload = (
        f if isinstance(f, torch.Tensor) else torch.from_numpy(f if f.flags.writeable else f.copy())
        for f in fields
    )
    return EncodedRoutes(
        codec=codec,
        meta=meta,
        num_rows=num_rows,
        offsets_B1=offsets_B1,
        valid_bits=valid_bits,
        payload=payload,
    )


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
    if (flags := unpack_valid_cpu(bits, num_rows)) is not None:
        return flags
    shifts_8 = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits[:, None] >> shifts_8) & 1).bool().reshape(-1)[:num_rows]


def payload_bytes(meta: RouteMeta, codec: str, num_valid: int) -> int:
    """Exact payload size of ``num_valid`` valid rows."""
    _check_arg(meta, RouteMeta, "meta")
    codec = check_codec(codec)
    n = as_index(num_valid, "num_valid", CodecError)
    if n < 0:
        raise CodecError(f"num_valid must be >= 0; got {n}")
    pairs = n * len(meta.moe_slots)
    if codec == "raw":
        return pairs * meta.top_k * narrowest_dtype(meta.num_experts).itemsize
    return stream_bytes(pairs, field_bits(meta, codec))


def encode_routes(batch: RouteBatch, codec: str = DEFAULT_CODEC) -> EncodedRoutes:
    """Encode ``batch`` with ``codec``. Ids outside ``[0, E)`` on valid MoE slots raise, and so do
    repeated ids under ``set``: a payload is exact or it is not written."""
    _check_arg(batch, RouteBatch, "batch")
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
    _check_arg(encoded, EncodedRoutes, "encoded")
    meta, name = encoded.meta, check_codec(encoded.codec)
    home = getattr(encoded.payload, "device", "cpu")  # not a tensor: refused with its size
    dev = torch.device(home if device is None else device)
    valid_N, payload = _valid_and_payload(encoded, dev)
    V, M, K = count_valid(valid_N), len(meta.moe_slots), meta.top_k
    N, L = encoded.num_rows, len(meta.layer_numbers)
    if V == N and M == L:
        values_NLK = _decode_payload(payload, name, meta, V * M).reshape(V, M, K)
    else:
        values_NLK = zeros((N, L, K), narrowest_dtype(meta.num_experts), dev)
        _decode_into(payload, name, meta, V, values_NLK, valid_indices(valid_N))
    offsets_B1 = encoded.offsets_B1.to(dev)
    return RouteBatch(values_NLK, offsets_B1, valid_N, meta, validate=False)


def decode_routes_into(
    encoded: EncodedRoutes, out_XLK: torch.Tensor, rows_V: torch.Tensor | None = None
) -> torch.Tensor:
    """Write the ids of ``encoded``'s valid rows into ``out_XLK`` (``[X, L, K]``, any integer
    dtype that holds ids below E, on the device where they are wanted) and return it: the v-th
    valid row lands on output row ``rows_V[v]`` (default: its own row number, so ``X`` is the
    batch's row count), its MoE slots on their layer slots. Nothing else is written: zero the
    output first for rr's layout (dense slots and rows without a route hold zeros).

    The payload alone moves to ``out_XLK``'s device; the ids are decoded and cast there in one
    pass, with no intermediate batch under ``set`` on the CPU with numba (top-8 ids below 256).
    Under ``set`` each row's ids come back sorted. A wrong shape, a dtype too narrow for the
    ids or row numbers outside ``[0, X)`` raise :class:`CodecError`."""
    _check_arg(encoded, EncodedRoutes, "encoded")
    meta, name = encoded.meta, check_codec(encoded.codec)
    N, L, K = encoded.num_rows, len(meta.layer_numbers), meta.top_k
    if not isinstance(out_XLK, torch.Tensor) or out_XLK.dim() != 3 or out_XLK.shape[1:] != (L, K):
        got = tuple(out_XLK.shape) if isinstance(out_XLK, torch.Tensor) else type(out_XLK).__name__
        raise CodecError(
            f"decode_routes_into writes into a [rows, {L}, {K}] tensor (rows, layer slots, "
            f"top-k of this batch); got {got}"
        )
    if not holds_ids(out_XLK.dtype, meta.num_experts):
        raise CodecError(
            f"an output of dtype {out_XLK.dtype} cannot hold expert ids below "
            f"{meta.num_experts}; use an integer dtype such as "
            f"{narrowest_dtype(meta.num_experts)} or torch.int16"
        )
    dev = out_XLK.device
    valid_N, payload = _valid_and_payload(encoded, dev)
    V, X = count_valid(valid_N), out_XLK.shape[0]
    if rows_V is None:
        if X != N:
            raise CodecError(
                f"an output of {X} rows for a batch of {N} rows: pass rows_V, the output row of "
                f"each of the {V} valid rows"
            )
        rows = None if V == N else valid_indices(valid_N)
    else:
        rows = _output_rows(rows_V, V, X, dev)
    _decode_into(payload, name, meta, V, out_XLK, rows)
    return out_XLK


def _output_rows(rows_V: torch.Tensor, V: int, X: int, dev: torch.device) -> torch.Tensor:
    """``rows_V`` as int64 on ``dev``, or :class:`CodecError` naming what is wrong."""
    ok = isinstance(rows_V, torch.Tensor) and rows_V.shape == (V,)
    ok = ok and not (rows_V.dtype.is_floating_point or rows_V.dtype == torch.bool)
    if not ok:
        raise CodecError(
            f"rows_V must be a 1-D integer tensor of {V} output rows (one per valid row); got "
            f"{describe(rows_V)}"
        )
    rows = rows_V.to(device=dev, dtype=torch.int64)
    if V:
        lo, hi = (int(v) for v in torch.aminmax(rows))
        if lo < 0 or hi >= X:
            raise CodecError(f"rows_V spans [{lo}, {hi}]; the output has rows [0, {X})")
    return rows


def _valid_and_payload(
    encoded: EncodedRoutes, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The validity mask and the payload on ``dev``, the payload's size checked."""
    meta, name = encoded.meta, check_codec(encoded.codec)
    valid_N = unpack_valid(encoded.valid_bits.to(dev), encoded.num_rows)
    V, M = count_valid(valid_N), len(meta.moe_slots)
    expected = payload_bytes(meta, name, V)
    payload = payload_as_bytes(encoded.payload, expected, name).to(dev)
    if payload.numel() != expected:
        raise CodecError(
            f"a {name!r} payload of {V} valid rows x {M} MoE layers has {expected} bytes, not "
            f"{payload.numel()}"
        )
    return valid_N, payload


def _compiled_set(meta: RouteMeta, device: torch.device) -> bool:
    """Whether the ``set`` payload of this shape decodes through the compiled kernel."""
    E, K = meta.num_experts, meta.top_k
    return (
        fast_shape(E, K, narrowest_dtype(E), device)
        and set_width(E, K) > 0
        and little_endian()
        and kernels.kernel() == "numba"
    )


def _decode_into(
    payload: torch.Tensor,
    codec: CodecName,
    meta: RouteMeta,
    V: int,
    out_XLK: torch.Tensor,
    rows_V: torch.Tensor | None,
) -> None:
    """Ids of the payload's ``V`` rows (its size checked) into ``out_XLK`` at ``rows_V``
    (None: row v) and the MoE slots."""
    M, K = len(meta.moe_slots), meta.top_k
    slots_M = torch.tensor(meta.moe_slots, dtype=torch.int64)
    if V == 0:
        return
    if codec == "set" and _compiled_set(meta, out_XLK.device) and out_XLK.is_contiguous():
        rows = None if rows_V is None else rows_V.cpu()
        width = set_width(meta.num_experts, K)
        if not unrank_into(payload, V * M, meta.num_experts, width, out_XLK, rows, slots_M):
            raise CodecError(f"a set rank is >= C({meta.num_experts}, {K}); the payload is corrupt")
        return
    ids_VMK = _decode_payload(payload, codec, meta, V * M).reshape(V, M, K)
    scatter_rows(ids_VMK, out_XLK, rows_V, slots_M)


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
        if pairs and _compiled_set(meta, payload.device):
            out = empty((pairs, 1, K), torch.uint8, payload.device)
            if not unrank_into(
                payload, pairs, E, width, out, None, torch.zeros(1, dtype=torch.int64)
            ):
                raise CodecError(f"a set rank is >= C({E}, {K}); the payload is corrupt")
            return out.reshape(-1)
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
