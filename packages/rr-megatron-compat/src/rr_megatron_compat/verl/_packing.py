"""verl's THD packing functions (``verl.models.mcore.util``), written by rr for route tensors.

The drop-in packs routes and replay masks through the four names verl's router-replay module
imports (``preprocess_packed_seqs``, ``postprocess_packed_seqs``, ``preprocess_thd_engine``,
``postprocess_thd_engine``), looked up on :mod:`rr_megatron_compat.verl` at call time, so a test
or a fix that replaces one there changes what the drop-in does. The packed order is verl's: each
sequence's valid rows one after another, padded at its end to ``tp`` (``2 * tp * cp`` under
context parallelism), and split over the CP ranks zigzag. Where verl returns Megatron's
``PackedSeqParams`` these return a :class:`PackedRows`, which is all their inverse needs.
Works on any trailing shape (``[B, S]`` ids, ``[B, S, L, K]`` routes) and keeps the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rr_core import AlignmentError
from rr_megatron_compat._checks import check_instance
from rr_megatron_compat._guards import ReplayConfigError
from rr_megatron_compat._tokens import sp_alignment, thd_cp_index
from rr_megatron_compat._wire import all_gather_exact
from rr_megatron_compat.verl._names import NAMES


@dataclass(frozen=True)
class PackedRows:
    """How a batch was packed on this rank: valid rows per sequence, padded offsets, CP split."""

    lengths: tuple[int, ...]
    cu_seqlens_padded: torch.Tensor  # int64 [N + 1], before the CP split
    cp_size: int
    cp_rank: int
    cp_group: Any  # None: Megatron's context-parallel group

    def local_index(self) -> torch.Tensor | None:
        """Packed-row indices this CP rank holds (None without CP)."""
        if self.cp_size == 1:
            return None
        return thd_cp_index(self.cu_seqlens_padded, self.cp_rank, self.cp_size)

    def valid_rows(self) -> torch.Tensor:
        """``[T_local]`` bool: True on sequence rows, False on alignment padding."""
        valid = torch.zeros(int(self.cu_seqlens_padded[-1]), dtype=torch.bool)
        for start, n in zip(self.cu_seqlens_padded.tolist(), self.lengths, strict=False):
            valid[start : start + n] = True
        index = self.local_index()
        return valid if index is None else valid[index]


def _parallel(local_cp_size: int | None) -> tuple[int, int, int, Any]:
    """(tp, cp, cp_rank, cp_group) from the parallel state verl's module calls ``mpu``."""
    mpu = NAMES.mpu
    tp = int(mpu.get_tensor_model_parallel_world_size())
    if local_cp_size is None:
        cp = int(mpu.get_context_parallel_world_size())
        return tp, cp, int(mpu.get_context_parallel_rank()) if cp > 1 else 0, None
    group = _dynamic_cp_group(mpu, local_cp_size)
    return tp, local_cp_size, int(torch.distributed.get_rank(group=group)), group


def _dynamic_cp_group(mpu: Any, local_cp_size: int) -> Any:
    """The context-parallel group of this micro-batch under dynamic CP (verl 0.9.1 takes it
    from Megatron's ``get_dynamic_data_context_parallel_groups``)."""
    groups = getattr(mpu, "get_dynamic_data_context_parallel_groups", None)
    if groups is None:
        from rr_megatron_compat._versions import megatron_line

        raise ReplayConfigError(
            f"local_cp_size={local_cp_size} (dynamic context parallelism) needs "
            "megatron.core.parallel_state.get_dynamic_data_context_parallel_groups, which "
            f"megatron-core {megatron_line().version} does not have"
        )
    group = groups(group_size=local_cp_size)
    size = torch.distributed.get_world_size(group=group)
    if size != local_cp_size:
        raise ReplayConfigError(
            f"the dynamic CP group of local_cp_size={local_cp_size} has {size} ranks"
        )
    return group


def _refuse(use_fp8_padding: bool, cp_layout: str = "zigzag", **unsupported: Any) -> None:
    if use_fp8_padding:
        raise ReplayConfigError("fp8 row padding (fp8='e4m3' / 'hybrid') is not supported by rr")
    if cp_layout != "zigzag":
        raise ReplayConfigError(f"rr packs the zigzag context-parallel layout; got {cp_layout!r}")
    for name, value in unsupported.items():
        if value:
            raise ReplayConfigError(f"rr's route packing does not take {name}={value!r}")


def _pack(
    values: torch.Tensor, lengths: list[int], local_cp_size: int | None
) -> tuple[torch.Tensor, PackedRows]:
    """``values`` (every sequence's valid rows, concatenated) padded per sequence and CP-split."""
    tp, cp, cp_rank, group = _parallel(local_cp_size)
    align = sp_alignment(tp, cp)
    padded = [n + (-n % align) for n in lengths]
    cu = torch.tensor([0, *padded], dtype=torch.int64).cumsum(0)
    params = PackedRows(tuple(lengths), cu, cp, cp_rank, group)
    rows = values  # already aligned: the values themselves, no copy
    if padded != lengths:
        rows = values.new_zeros((int(cu[-1]), *values.shape[1:]))
        start = 0
        for to, n in zip(cu.tolist(), lengths, strict=False):
            rows[to : to + n] = values[start : start + n]
            start += n
    index = params.local_index()
    return (rows if index is None else rows[index.to(rows.device)]), params


def _unpack(rows: torch.Tensor, params: PackedRows) -> torch.Tensor:
    """The valid rows of every sequence, concatenated (CP parts gathered first)."""
    check_instance(
        params,
        PackedRows,
        AlignmentError,
        "rr's postprocess takes the PackedRows its preprocess returned",
    )
    if params.cp_size > 1:
        group = params.cp_group
        if group is None:
            group = NAMES.mpu.get_context_parallel_group()
        full = rows.new_zeros((int(params.cu_seqlens_padded[-1]), *rows.shape[1:]))
        for rank, part in enumerate(all_gather_exact(rows.contiguous(), group)):
            index = thd_cp_index(params.cu_seqlens_padded, rank, params.cp_size)
            full[index.to(full.device)] = part
        rows = full
    total = int(params.cu_seqlens_padded[-1])
    if rows.shape[0] != total:
        raise AlignmentError(
            f"routers saw {rows.shape[0]} rows but the batch packs to {total}; record the "
            "micro-batch the forward ran on"
        )
    if sum(params.lengths) == total:
        return rows
    starts = params.cu_seqlens_padded.tolist()
    return torch.cat([rows[s : s + n] for s, n in zip(starts, params.lengths, strict=False)])


def _dense_rows(
    batch: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, list[int]]:
    """The valid rows of a dense ``[B, S, ...]`` batch, concatenated, and their count per row."""
    if attention_mask is None:  # no mask, no padding: every row of every sequence is valid
        return batch.reshape(-1, *batch.shape[2:]), [int(batch.shape[1])] * int(batch.shape[0])
    keep = attention_mask.bool().to(batch.device)
    if keep.shape != batch.shape[:2]:
        raise AlignmentError(
            f"attention_mask {tuple(keep.shape)} does not fit a batch of shape {tuple(batch.shape)}"
        )
    return batch[keep], [int(n) for n in keep.sum(dim=-1).tolist()]


def preprocess_packed_seqs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    pre_process: bool = True,
    use_fp8_padding: bool = False,
) -> tuple[torch.Tensor, PackedRows]:
    """Dense ``[B, S, ...]`` (valid rows under ``attention_mask``; ``None``: all rows) packed as
    ``[1, T_local, ...]`` for this rank, and how."""
    _refuse(use_fp8_padding)
    rows, params = _pack(*_dense_rows(input_ids, attention_mask), None)
    return rows.unsqueeze(0), params


def postprocess_packed_seqs(
    output: torch.Tensor,
    packed_seq_params: PackedRows,
    attention_mask: torch.Tensor | None,
    batch_size: int,
    seq_len: int,
    post_process: bool = True,
) -> torch.Tensor:
    """``[1, T_local, ...]`` back to ``[B, S, ...]``, zeros outside ``attention_mask``."""
    if not post_process:
        return output
    values = _unpack(output.squeeze(0), packed_seq_params)
    out = values.new_zeros((batch_size, seq_len, *values.shape[1:]))
    if attention_mask is None:
        out.view(-1, *values.shape[1:])[:] = values
    else:
        out[attention_mask.bool().to(out.device)] = values
    return out


def preprocess_thd_engine(
    input_ids: torch.Tensor,
    pre_process: bool = True,
    need_roll: bool = False,
    use_fp8_padding: bool = False,
    local_cp_size: int | None = None,
    min_local_rows: int | None = None,
    pad_to_length_bucket: int | None = None,
    cp_layout: str = "zigzag",
) -> tuple[torch.Tensor, PackedRows, None]:
    """Jagged ``[B, j, ...]`` packed as ``[1, T_local, ...]`` for this rank (the CP group of
    ``local_cp_size`` under dynamic CP), how, and None (verl's rolled labels: none for routes)."""
    _refuse(
        use_fp8_padding,
        cp_layout,
        need_roll=need_roll,
        min_local_rows=min_local_rows,
        pad_to_length_bucket=pad_to_length_bucket,
    )
    if not input_ids.is_nested:
        raise AlignmentError(f"preprocess_thd_engine takes a jagged tensor; got {input_ids.shape}")
    starts = input_ids.offsets()  # type: ignore[attr-defined]
    lengths = [int(n) for n in starts.diff().tolist()]
    rows, params = _pack(input_ids.values(), lengths, local_cp_size)
    return rows.unsqueeze(0), params, None


def postprocess_thd_engine(
    output: torch.Tensor,
    packed_seq_params: PackedRows,
    input_ids: torch.Tensor,
    batch_size: int,
    post_process: bool = True,
    local_cp_size: int | None = None,
    cp_layout: str = "zigzag",
) -> torch.Tensor:
    """``[1, T_local, ...]`` back to jagged ``[B, j, ...]`` on ``input_ids``' offsets."""
    if not post_process:
        return output
    _refuse(False, cp_layout)
    values = _unpack(output.squeeze(0), packed_seq_params)
    starts = input_ids.offsets().to(values.device)  # type: ignore[attr-defined]
    return torch.nested.nested_tensor_from_jagged(values, starts)
