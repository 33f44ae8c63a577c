"""Routes to and from the token layout a Megatron model actually runs on.

Megatron's hidden states are ``[S, B, H]`` and a router sees ``view(-1, H)``: its rows are
sequence-major (row ``s * B + b``). Before that, context parallelism keeps part of every
sequence on each CP rank (zigzag: with ``2 * cp`` equal chunks, rank r holds chunks r and
``2cp - 1 - r``, as ``get_batch_on_this_cp_rank`` does; or contiguous: chunk r of ``cp``), and
sequence parallelism splits the first dim ``S`` into ``tp`` equal parts
(``scatter_to_sequence_parallel_region``). Packed (THD) batches run as ``[T, 1, H]`` with
``PackedSeqParams``: sequence i sits at ``cu_seqlens_padded[i]`` and is ``cu_seqlens`` long;
under CP each padded sequence is zigzag-split on its own.

Padding for alignment (D5) is appended after real rows, never before them, so a row keeps its
position and padded rows are invalid in the mask. A layout mismatch (D6) is an error, not a
silent re-slice: every split checks its divisibility and names the fix.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rr_core import AlignmentError, pad_rows
from rr_megatron_compat._checks import as_index, check_choice, check_instance, check_tensor
from rr_megatron_compat._versions import import_megatron
from rr_megatron_compat._wire import all_gather_exact, group_rank_size, megatron_group

CPLayout = Literal["zigzag", "contiguous"]
CP_LAYOUTS: tuple[CPLayout, ...] = ("zigzag", "contiguous")


def _check_rank(rank: object, size: object, what: str) -> tuple[int, int]:
    """(rank, size) as ints (numpy / torch integer scalars qualify), rank in ``0..size - 1``."""
    r = as_index(rank, f"the {what} rank", AlignmentError)
    n = as_index(size, f"the {what} size", AlignmentError)
    if not 1 <= n < 2**31:
        raise AlignmentError(f"the {what} size must be in [1, 2**31); got {n}")
    if not 0 <= r < n:
        raise AlignmentError(f"{what} rank {r} is outside 0..{n - 1} (size {n})")
    return r, n


def _check_layout(layout: object) -> CPLayout:
    return check_choice(layout, "the CP layout", CP_LAYOUTS, AlignmentError)  # type: ignore[return-value]


def _check_dim(t: torch.Tensor, dim: object) -> int:
    d = as_index(dim, "dim", AlignmentError)
    if not -t.dim() <= d < t.dim():
        raise AlignmentError(f"dim={d} is outside a tensor of shape {tuple(t.shape)}")
    return d


def _routes(value: object, what: str, ndim: int) -> torch.Tensor:
    return check_tensor(value, what, AlignmentError, ndim=ndim, integer=True)


# -- router rows ----------------------------------------------------------------------------------


def batch_to_router_rows(routes_BSLK: torch.Tensor) -> torch.Tensor:
    """``[B, S, L, K]`` routes in the router's row order ``[S * B, L, K]`` (sequence-major)."""
    _routes(routes_BSLK, "routes_BSLK ([B, S, L, K] route ids)", 4)
    B, S, L, K = routes_BSLK.shape
    return routes_BSLK.transpose(0, 1).reshape(S * B, L, K)


def router_rows_to_batch(rows_TLK: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Inverse of :func:`batch_to_router_rows`: ``[S * B, L, K]`` back to ``[B, S, L, K]``."""
    T, L, K = _routes(rows_TLK, "rows_TLK ([S * B, L, K] route ids)", 3).shape
    batch_size = as_index(batch_size, "batch_size", AlignmentError)
    if batch_size < 1 or T % batch_size:
        raise AlignmentError(f"{T} router rows do not split into batch_size={batch_size} sequences")
    return rows_TLK.reshape(T // batch_size, batch_size, L, K).transpose(0, 1)


# -- sequence parallelism (D5) --------------------------------------------------------------------


def sp_alignment(tp_size: int, cp_size: int = 1) -> int:
    """Rows a sequence must be a multiple of: ``tp`` for SP, ``2 * cp * tp`` with CP > 1."""
    tp_size = as_index(tp_size, "tp_size", AlignmentError)
    cp_size = as_index(cp_size, "cp_size", AlignmentError)
    if tp_size < 1 or cp_size < 1:
        raise AlignmentError(f"tp_size and cp_size must be >= 1; got {tp_size}, {cp_size}")
    return tp_size * cp_size * 2 if cp_size > 1 else tp_size


def sp_pad(
    routes_TLK: torch.Tensor, mask_T: torch.Tensor, tp_size: int, cp_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad at the end to :func:`sp_alignment` rows (D5): real rows keep their positions."""
    return pad_rows(routes_TLK, mask_T, sp_alignment(tp_size, cp_size))


def sp_scatter(rows: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's part of ``rows`` along dim 0, as ``scatter_to_sequence_parallel_region``."""
    check_tensor(rows, "rows", AlignmentError, min_ndim=1)
    tp_rank, tp_size = _check_rank(tp_rank, tp_size, "tensor-parallel")
    n = rows.shape[0]
    if n % tp_size:
        raise AlignmentError(
            f"{n} rows do not split evenly over tp_size={tp_size} for sequence parallelism; pad "
            "them at the end first (sp_pad, D5) rather than shifting rows; see `rr explain D5`"
        )
    part = n // tp_size
    return rows[tp_rank * part : (tp_rank + 1) * part]


def sp_gather(local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All TP ranks' parts concatenated along dim 0 (``gather_from_sequence_parallel_region``).

    Integer payloads travel as uint8 views; ``group`` defaults to Megatron's TP group.
    """
    check_tensor(local, "local", AlignmentError, min_ndim=1)
    group = megatron_group("tensor_model_parallel") if group is None else group
    return torch.cat(all_gather_exact(local, group), dim=0)


# -- context parallelism (D6) ---------------------------------------------------------------------


def cp_chunk_ids(cp_rank: int, cp_size: int, layout: CPLayout = "zigzag") -> tuple[int, ...]:
    """Which equal chunks of a sequence a CP rank holds: of ``2 * cp`` (zigzag) or ``cp``."""
    layout = _check_layout(layout)
    cp_rank, cp_size = _check_rank(cp_rank, cp_size, "context-parallel")
    if layout == "zigzag":
        return (cp_rank, 2 * cp_size - 1 - cp_rank)
    if layout == "contiguous":
        return (cp_rank,)
    raise AlignmentError(f"CP layout {layout!r} is not one of {CP_LAYOUTS}")


def _num_chunks(cp_size: int, layout: CPLayout) -> int:
    return 2 * cp_size if layout == "zigzag" else cp_size


def cp_split(
    seq: torch.Tensor, cp_rank: int, cp_size: int, *, layout: CPLayout = "zigzag", dim: int = 0
) -> torch.Tensor:
    """This CP rank's rows of a sequence along ``dim`` (zigzag as Megatron's batch split)."""
    check_tensor(seq, "seq", AlignmentError, min_ndim=1)
    dim = _check_dim(seq, dim)
    cp_rank, cp_size = _check_rank(cp_rank, cp_size, "context-parallel")
    ids = cp_chunk_ids(cp_rank, cp_size, layout)
    n, chunks = seq.shape[dim], _num_chunks(cp_size, layout)
    if n % chunks:
        raise AlignmentError(
            f"a sequence of {n} rows does not split into {chunks} equal chunks for cp_size="
            f"{cp_size} ({layout}); pad it at the end to a multiple of "
            f"{sp_alignment(1, cp_size) if layout == 'zigzag' else cp_size} first (D5); "
            "see `rr explain D5`"
        )
    parts = seq.chunk(chunks, dim=dim)
    return torch.cat([parts[i] for i in ids], dim=dim)


def cp_merge(
    parts: Sequence[torch.Tensor], *, layout: CPLayout = "zigzag", dim: int = 0
) -> torch.Tensor:
    """The whole sequence from every CP rank's part (``parts[r]`` from rank r)."""
    layout = _check_layout(layout)
    if isinstance(parts, torch.Tensor) or not isinstance(parts, Sequence) or not parts:
        raise AlignmentError(
            "cp_merge takes a non-empty list with one tensor per CP rank (parts[r] from rank r); "
            f"got {type(parts).__name__}"
        )
    for rank, part in enumerate(parts):
        check_tensor(part, f"CP rank {rank}'s part", AlignmentError, min_ndim=1)
    dim = _check_dim(parts[0], dim)
    cp_size = len(parts)
    chunks: list[torch.Tensor | None] = [None] * _num_chunks(cp_size, layout)
    for rank, part in enumerate(parts):
        ids = cp_chunk_ids(rank, cp_size, layout)
        if part.shape[dim] % len(ids):
            raise AlignmentError(f"CP rank {rank}'s part has {part.shape[dim]} rows, not even")
        for chunk_id, piece in zip(ids, part.chunk(len(ids), dim=dim), strict=True):
            chunks[chunk_id] = piece
    return torch.cat([c for c in chunks if c is not None], dim=dim)


def cp_gather(
    local: torch.Tensor, group: Any = None, *, layout: CPLayout = "zigzag", dim: int = 0
) -> torch.Tensor:
    """Gather every CP rank's part and restore token order; ``group`` defaults to Megatron's CP
    group. Integer payloads travel as uint8 views."""
    check_tensor(local, "local", AlignmentError, min_ndim=1)
    _check_layout(layout)
    _check_dim(local, dim)
    group = megatron_group("context_parallel") if group is None else group
    return cp_merge(all_gather_exact(local, group), layout=layout, dim=dim)


# -- packed sequences (THD) -----------------------------------------------------------------------


@dataclass(frozen=True)
class PackedRoutes:
    """Routes of sequences packed as Megatron's THD format runs them.

    ``rows_TLK[cu_seqlens_padded[i] : cu_seqlens_padded[i] + len_i]`` are sequence i's routes;
    alignment padding follows each sequence and is invalid in ``mask_T``. The cu_seqlens tensors
    are int32, as ``PackedSeqParams`` takes them.
    """

    rows_TLK: torch.Tensor
    mask_T: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    max_seqlen: int

    def __post_init__(self) -> None:
        rows = _routes(self.rows_TLK, "PackedRoutes.rows_TLK ([T, L, K] route ids)", 3)
        mask = check_tensor(
            self.mask_T, "PackedRoutes.mask_T", AlignmentError, ndim=1, boolean=True
        )
        if mask.shape[0] != rows.shape[0]:
            raise AlignmentError(
                f"PackedRoutes: mask_T has {mask.shape[0]} rows but rows_TLK has {rows.shape[0]}"
            )
        cu = check_tensor(
            self.cu_seqlens, "PackedRoutes.cu_seqlens", AlignmentError, ndim=1, integer=True
        )
        cu_pad = check_tensor(
            self.cu_seqlens_padded,
            "PackedRoutes.cu_seqlens_padded",
            AlignmentError,
            ndim=1,
            integer=True,
        )
        if cu.shape != cu_pad.shape or cu.shape[0] < 1:
            raise AlignmentError(
                f"PackedRoutes: cu_seqlens {tuple(cu.shape)} and cu_seqlens_padded "
                f"{tuple(cu_pad.shape)} must be equal [N + 1] offsets"
            )
        max_seqlen = as_index(self.max_seqlen, "PackedRoutes.max_seqlen", AlignmentError)
        if max_seqlen < 0:
            raise AlignmentError(f"PackedRoutes.max_seqlen must be >= 0; got {max_seqlen}")
        object.__setattr__(self, "max_seqlen", max_seqlen)


def _packed(value: object, where: str) -> PackedRoutes:
    return check_instance(
        value, PackedRoutes, AlignmentError, f"{where} takes the PackedRoutes thd_pack returns"
    )


def thd_pack(
    routes: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor] | None = None,
    *,
    align: int = 1,
) -> PackedRoutes:
    """Pack per-sequence ``[T_i, L, K]`` routes, each padded at its end to ``align`` rows (use
    :func:`sp_alignment`); ``masks`` default to all-valid."""
    m = as_index(align, "align", AlignmentError)
    if isinstance(routes, torch.Tensor) or not isinstance(routes, Sequence):
        raise AlignmentError(
            f"thd_pack takes a list of [T_i, L, K] route tensors; got {type(routes).__name__}"
        )
    for i, r in enumerate(routes):
        _routes(r, f"routes[{i}] ([T_i, L, K] route ids)", 3)
        if r.shape[1:] != routes[0].shape[1:]:
            raise AlignmentError(
                f"thd_pack: every sequence's routes share one [L, K]; routes[0] is "
                f"{list(routes[0].shape[1:])}, routes[{i}] is {list(r.shape[1:])}"
            )
    if masks is not None and (isinstance(masks, torch.Tensor) or not isinstance(masks, Sequence)):
        raise AlignmentError(
            f"thd_pack takes masks as a list of [T_i] bool tensors; got {type(masks).__name__}"
        )
    if m < 1 or not routes:
        raise AlignmentError(f"thd_pack needs >= 1 sequence and align >= 1; got align={m}")
    masks = (
        masks if masks is not None else [torch.ones(r.shape[0], dtype=torch.bool) for r in routes]
    )
    if len(masks) != len(routes):
        raise AlignmentError(f"{len(routes)} route sequences but {len(masks)} masks")
    padded = [pad_rows(r, mk, m) for r, mk in zip(routes, masks, strict=True)]
    lengths = torch.tensor([r.shape[0] for r in routes], dtype=torch.int32)
    padded_lengths = torch.tensor([r.shape[0] for r, _ in padded], dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32)
    return PackedRoutes(
        rows_TLK=torch.cat([r for r, _ in padded]),
        mask_T=torch.cat([mk for _, mk in padded]),
        cu_seqlens=torch.cat([zero, lengths.cumsum(0, dtype=torch.int32)]),
        cu_seqlens_padded=torch.cat([zero, padded_lengths.cumsum(0, dtype=torch.int32)]),
        max_seqlen=int(padded_lengths.max()),
    )


def thd_unpack(packed: PackedRoutes) -> list[torch.Tensor]:
    """Per-sequence routes (views) without their alignment padding."""
    _packed(packed, "thd_unpack")
    starts = packed.cu_seqlens_padded.tolist()
    lengths = (packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]).tolist()
    return [packed.rows_TLK[s : s + n] for s, n in zip(starts, lengths, strict=False)]


def thd_cp_index(cu_seqlens_padded: torch.Tensor, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Packed-row indices a CP rank holds: each padded sequence zigzag-split on its own (what
    Transformer Engine's ``thd_get_partitioned_indices`` returns for Megatron's THD batches)."""
    check_tensor(cu_seqlens_padded, "cu_seqlens_padded", AlignmentError, ndim=1, integer=True)
    cp_rank, cp_size = _check_rank(cp_rank, cp_size, "context-parallel")
    bounds = cu_seqlens_padded.tolist()
    pieces: list[torch.Tensor] = []
    for start, end in itertools.pairwise(bounds):
        n = end - start
        if n % (2 * cp_size):
            raise AlignmentError(
                f"a packed sequence of {n} padded rows does not split into {2 * cp_size} chunks; "
                f"pack with align=sp_alignment(tp, cp={cp_size})"
            )
        c = n // (2 * cp_size)
        for chunk in cp_chunk_ids(cp_rank, cp_size, "zigzag"):
            pieces.append(torch.arange(start + chunk * c, start + (chunk + 1) * c))
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def packed_seq_params(packed: PackedRoutes) -> Any:
    """Megatron's ``PackedSeqParams`` (THD) for the batch these routes were packed for."""
    _packed(packed, "packed_seq_params")
    module = import_megatron("megatron.core.packed_seq_params")
    return module.PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=packed.cu_seqlens,
        cu_seqlens_kv=packed.cu_seqlens,
        cu_seqlens_q_padded=packed.cu_seqlens_padded,
        cu_seqlens_kv_padded=packed.cu_seqlens_padded,
        max_seqlen_q=packed.max_seqlen,
        max_seqlen_kv=packed.max_seqlen,
    )


def cp_rank_size(group: Any = None) -> tuple[int, int]:
    """(rank, size) in ``group`` or Megatron's CP group."""
    return group_rank_size(megatron_group("context_parallel") if group is None else group)
