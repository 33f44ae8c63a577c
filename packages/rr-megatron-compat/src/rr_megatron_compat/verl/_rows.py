"""Route rows in the order the model runs them, and back (see :mod:`rr_megatron_compat.verl`).

verl's steps, each through the name verl's module uses for it, read on
:mod:`rr_megatron_compat.verl` at call time: pack (``preprocess_thd_engine`` for jagged batches,
``preprocess_packed_seqs`` for dense ones, rr's own by default: :mod:`._packing`), move to
``device_name``, split over the sequence-parallel ranks (``scatter_to_sequence_parallel_region``);
recorded rows come back through ``gather_from_sequence_parallel_region`` (as uint8, which every
collective carries) and the matching ``postprocess_*``. Shapes: T rows, L layer slots, K top-k.
"""

from __future__ import annotations

from typing import Any

import torch

from rr_core import AlignmentError
from rr_megatron_compat.verl._layers import offsets
from rr_megatron_compat.verl._names import NAMES
from rr_megatron_compat.verl._packing import PackedRows


def _layout_args(tf_config: Any, local_cp_size: int | None) -> dict[str, Any]:
    return {
        "pre_process": True,
        "use_fp8_padding": getattr(tf_config, "fp8", None) in ("e4m3", "hybrid"),
        "local_cp_size": local_cp_size,
        "cp_layout": NAMES._context_parallel_layout(tf_config),
    }


def _packed(
    batch: torch.Tensor, attention_mask: torch.Tensor | None, tf_config: Any, lcs: int | None
) -> tuple[torch.Tensor, Any]:
    """``[T_local, ...]`` of a jagged or dense batch, and what the packing returned about it."""
    if batch.is_nested:
        rows, params, _ = NAMES.preprocess_thd_engine(batch, **_layout_args(tf_config, lcs))
    else:
        use_fp8 = _layout_args(tf_config, lcs)["use_fp8_padding"]
        rows, params = NAMES.preprocess_packed_seqs(
            batch, attention_mask, pre_process=True, use_fp8_padding=use_fp8
        )
    return rows.squeeze(0), params


def to_router_rows(
    routes: torch.Tensor,
    replay_mask: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    tf_config: Any,
    local_cp_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's router rows ``[T, L, K]`` and replay mask (``None``: replay every row) for
    routes ``[B, S|j, L, K]`` (dense under ``attention_mask``, every row without one; or
    jagged). Alignment padding rows are outside the mask: they route natively."""
    rows, params = _packed(routes, attention_mask, tf_config, local_cp_size)
    mask = None
    if replay_mask is not None:
        if replay_mask.is_nested != routes.is_nested:
            raise AlignmentError("replay_mask must be jagged exactly when the routes are")
        mask, _ = _packed(replay_mask, attention_mask, tf_config, local_cp_size)
        if mask.shape[:1] != rows.shape[:1]:
            raise AlignmentError(f"replay_mask has {mask.shape[0]} rows for {rows.shape[0]} routes")
        mask = mask.bool()
    if isinstance(params, PackedRows) and sum(params.lengths) != int(params.cu_seqlens_padded[-1]):
        valid = params.valid_rows().to(rows.device)
        mask = valid if mask is None else mask & valid.to(mask.device)
    device = NAMES.device_name
    rows = NAMES.scatter_to_sequence_parallel_region(rows.to(device))
    if mask is not None:
        mask = NAMES.scatter_to_sequence_parallel_region(mask.to(device))
    return rows, None if mask is None or bool(mask.all()) else mask


def from_router_rows(
    rows: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    tf_config: Any,
    local_cp_size: int | None,
) -> torch.Tensor:
    """Inverse of :func:`to_router_rows` for the recorded int16 rows ``[T_local, m, K]``: jagged
    ``[B, j, m, K]`` on ``input_ids``' offsets, or dense ``[B, S, m, K]`` with zeros outside
    ``attention_mask`` (every row without one)."""
    payload = rows.to(NAMES.device_name, torch.int16).contiguous().view(torch.uint8)
    payload = NAMES.gather_from_sequence_parallel_region(
        payload, tensor_parallel_output_grad=False
    ).unsqueeze(0)
    if input_ids.is_nested:
        args = _layout_args(tf_config, local_cp_size)
        _, params, _ = NAMES.preprocess_thd_engine(input_ids, **args)
        out = NAMES.postprocess_thd_engine(
            payload,
            params,
            input_ids,
            input_ids.shape[0],
            post_process=True,
            local_cp_size=local_cp_size,
            cp_layout=args["cp_layout"],
        )
        values = out.values().contiguous().view(torch.int16)
        return torch.nested.nested_tensor_from_jagged(values, offsets(out))
    use_fp8 = _layout_args(tf_config, local_cp_size)["use_fp8_padding"]
    _, params = NAMES.preprocess_packed_seqs(
        input_ids, attention_mask, pre_process=True, use_fp8_padding=use_fp8
    )
    batch_size, seq_len = input_ids.shape[:2]
    padded = NAMES.postprocess_packed_seqs(
        payload, params, attention_mask, batch_size, seq_len, post_process=True
    )
    return torch.as_tensor(padded).view(torch.int16)
