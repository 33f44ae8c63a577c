"""Route batches in the token order a transformers model's routers see.

A sparse MoE block flattens its input ``[B, S, H]`` to ``[B*S, H]``, so the routers see padded
batches row by row (padding included) and packed batches (one row, ``position_ids`` restarting
at 0 for each sequence, as flash-attention varlen packing does) as one stream. Sequence b's
route rows go to its first rows' tokens in order: an engine returns T-1 rows for T tokens (the
last sampled token was never fed back), so the last token of such a sequence, padding, and
rows the batch marks invalid route natively.

Shapes: B sequences, S padded length, N tokens the routers see, L layer slots, K top-k.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from rr_core import AlignmentError, ReplayController, RouteBatch
from rr_core.adapters import check_controller
from rr_transformers._packed import expect_packed


def routes_for_padded(
    batch: RouteBatch, attention_mask_BS: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B*S, L, K]`` routes and the ``[B*S]`` replay mask for a padded batch (left, right or
    any padding: sequence b's tokens are where ``attention_mask_BS[b]`` is nonzero)."""
    rows_N, replay_N, routed_N = _padded_rows(batch, attention_mask_BS)
    return _laid_out(batch, rows_N, routed_N), replay_N


def rows_for_padded(
    batch: RouteBatch, attention_mask_BS: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[B*S]`` int64 row of ``batch.values_NLK`` each router row replays and the
    ``[B*S]`` replay mask for a padded batch: :func:`routes_for_padded` without laying the
    routes out (rows outside the mask point at row 0)."""
    return _padded_rows(batch, attention_mask_BS)[:2]


def _padded_rows(
    batch: RouteBatch, attention_mask_BS: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per router row of a padded batch: its route row (0 where none), whether it replays,
    whether it has a route. Elementwise over [B, S] (no nonzero, no scatter: ~15 small ops)."""
    if not isinstance(attention_mask_BS, torch.Tensor) or attention_mask_BS.dim() != 2:
        got = getattr(attention_mask_BS, "shape", type(attention_mask_BS).__name__)
        raise AlignmentError(f"attention_mask must be a [B, S] tensor; got {got}")
    if (
        not isinstance(batch, RouteBatch)
        or attention_mask_BS.shape[0] != batch.offsets_B1.numel() - 1
    ):
        _rows_per_sequence(batch, attention_mask_BS.to(torch.bool).sum(1))  # raises, naming why
    device = batch.values_NLK.device
    mask_BS = attention_mask_BS.to(device=device, dtype=torch.bool)
    offsets_B1 = batch.offsets_B1.to(device)
    rows_B = offsets_B1.diff()
    rank_BS = mask_BS.cumsum(1)  # sequence b's token s is its rank_BS[b, s]-th (1-based)
    tokens_B = rank_BS[:, -1] if rank_BS.shape[1] else rows_B.new_zeros(rows_B.shape)
    if not set((tokens_B - rows_B).tolist()) <= {0, 1}:  # B numbers: cheaper in Python
        _rows_per_sequence(batch, tokens_B)  # raises, naming the sequence
    routed_BS = rank_BS <= rows_B[:, None]
    routed_BS &= mask_BS
    # route row offsets_B1[b] + rank - 1 where routed, row 0 elsewhere (valid_N reads it);
    # add and multiply in int64 (torch.where or a bool factor cost twice as much)
    rows_N = rank_BS.add_(offsets_B1[:-1, None] - 1).mul_(routed_BS.to(torch.int64)).view(-1)
    routed_N = routed_BS.view(-1)
    if batch.values_NLK.shape[0] == 0:
        return rows_N, routed_N, routed_N  # no route rows: nothing replays, nothing routed
    return rows_N, routed_N & batch.valid_N.index_select(0, rows_N), routed_N


def routes_for_packed(
    batch: RouteBatch, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, L, K]`` routes and the ``[N]`` replay mask for sequences packed into one row:
    ``position_ids`` (``[N]`` or ``[1, N]``) restarts at 0 where each sequence begins."""
    rows = _packed_rows(batch, position_ids)
    if rows is None:
        return batch.values_NLK, batch.valid_N  # a row per token, in order: the batch as it is
    return _laid_out(batch, rows[0], rows[2]), rows[1]


def _packed_rows(
    batch: RouteBatch, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """As :func:`_padded_rows` for a packed row; None where the batch holds a row per token,
    in order (it is armed as it is)."""
    if (
        not isinstance(position_ids, torch.Tensor)
        or position_ids.dim() not in (1, 2)
        or (position_ids.dim() == 2 and position_ids.shape[0] != 1)
        or position_ids.numel() == 0
    ):
        got = getattr(position_ids, "shape", type(position_ids).__name__)
        raise AlignmentError(f"position_ids must be [N] or [1, N] (one packed row); got {got}")
    if (
        position_ids.dtype == torch.bool
        or position_ids.is_floating_point()
        or position_ids.is_complex()
    ):
        raise AlignmentError(f"position_ids must be an integer tensor; got {position_ids.dtype}")
    pos_N = position_ids.flatten()
    if int(pos_N[0]) != 0:
        raise AlignmentError(f"packed position_ids must start at 0; got {int(pos_N[0])}")
    starts_N = pos_N == 0
    starts = starts_N.nonzero().squeeze(1)
    n = pos_N.numel()
    tokens_B = torch.diff(starts, append=torch.tensor([n], device=starts.device))
    if _rows_per_sequence(batch, tokens_B).equal(tokens_B):
        return None
    seq_N = torch.cumsum(starts_N, 0) - 1
    rank_N = torch.arange(n, device=pos_N.device) - starts[seq_N]
    return _index(batch, torch.arange(n, device=pos_N.device), seq_N, rank_N, tokens_B, n)


def _rows_per_sequence(batch: RouteBatch, tokens_B: torch.Tensor) -> torch.Tensor:
    """Each sequence's route rows, checked against its tokens: as many, or one fewer."""
    if not isinstance(batch, RouteBatch):
        raise AlignmentError(f"routes must be a rr_core.RouteBatch; got {type(batch).__name__}")
    rows_B = batch.lengths.to(tokens_B.device)
    if tokens_B.numel() != rows_B.numel():
        raise AlignmentError(
            f"the token layout holds {tokens_B.numel()} sequences; the route batch holds "
            f"{rows_B.numel()}"
        )
    short_B = tokens_B - rows_B
    bad_B = (short_B < 0) | (short_B > 1)
    if bool(bad_B.any()):
        b = int(bad_B.nonzero()[0])
        raise AlignmentError(
            f"sequence {b} has {int(tokens_B[b])} tokens but {int(rows_B[b])} route rows; "
            "expected as many rows as tokens, or one fewer (the last sampled token is never "
            "fed back); truncate the routes with the tokens (see `rr explain D7`)"
        )
    return rows_B


def _index(
    batch: RouteBatch,
    pos_N: torch.Tensor,
    seq_N: torch.Tensor,
    rank_N: torch.Tensor,
    tokens_B: torch.Tensor,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each of the ``n`` router rows: the route row it takes (0 where none), whether it
    replays, and whether it has a route at all."""
    rows_B = _rows_per_sequence(batch, tokens_B)
    device = batch.values_NLK.device
    take = rank_N < rows_B[seq_N]
    source = (batch.offsets_B1[:-1].to(seq_N.device)[seq_N] + rank_N)[take].to(device)
    target = pos_N[take].to(device)
    replay_N = torch.zeros(n, dtype=torch.bool, device=device)
    replay_N[target] = batch.valid_N[source]
    index_N = torch.zeros(n, dtype=torch.int64, device=device)
    index_N[target] = source
    routed_N = torch.zeros(n, dtype=torch.bool, device=device)
    routed_N[target] = True
    return index_N, replay_N, routed_N


def _laid_out(batch: RouteBatch, index_N: torch.Tensor, routed_N: torch.Tensor) -> torch.Tensor:
    """``[N, L, K]``: route row ``index_N[i]`` where ``routed_N[i]``, zeros elsewhere."""
    values_NLK = batch.values_NLK
    n = index_N.shape[0]
    if values_NLK.shape[0] == 0:
        return values_NLK.new_zeros((n, *values_NLK.shape[1:]))
    # One gather of whole rows viewed as wide integers (torch's index kernels cost per element:
    # an [N, L, K] uint8 scatter runs ~30x slower), then the rows without a route zeroed.
    routes_NW = _wide_rows(values_NLK).index_select(0, index_N)
    routes_NW.index_fill_(0, (~routed_N).nonzero().squeeze(1), 0)
    return routes_NW.view(values_NLK.dtype).view(n, *values_NLK.shape[1:])


def _wide_rows(values_NLK: torch.Tensor) -> torch.Tensor:
    """``values_NLK`` as ``[N, W]`` rows of the widest integer dtype that tiles a row."""
    rows = values_NLK.contiguous().view(values_NLK.shape[0], -1)
    row_bytes = rows.shape[1] * rows.element_size()
    for wide in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=wide).element_size()
        if size > rows.element_size() and row_bytes % size == 0:
            try:
                return rows.view(wide)
            except RuntimeError:  # a storage offset the wide dtype cannot align to
                continue
    return rows


def arm_routes(
    controller: ReplayController,
    microbatch: Hashable,
    batch: RouteBatch,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> None:
    """Arm ``batch`` for one micro-batch laid out as the model will see it: padded
    (``attention_mask`` [B, S]) or packed (``position_ids`` of one row); exactly one of them.

    The forward of a packed micro-batch is checked: it must get these ``position_ids``, no 2D
    attention mask and no KV cache (``use_cache`` left to the config default is turned off;
    ``use_cache=True`` or a cache raises :class:`PackedForwardError`), as transformers keeps
    packed sequences apart only then."""
    if (attention_mask is None) == (position_ids is None):
        raise AlignmentError(
            "pass exactly one of attention_mask (a padded batch) or position_ids (a packed row)"
        )
    if not isinstance(batch, RouteBatch):
        raise AlignmentError(f"routes must be a rr_core.RouteBatch; got {type(batch).__name__}")
    check_controller(controller, "rr_transformers.arm_routes")
    sizes = (batch.meta.num_experts, batch.meta.top_k)
    if sizes != (controller.num_experts, controller.top_k):
        raise AlignmentError(
            f"micro-batch {microbatch!r}: routes were captured with E={sizes[0]}, K={sizes[1]}; "
            f"this model has E={controller.num_experts}, K={controller.top_k}"
        )
    # the batch's own rows, through a row index where the layout is not the batch's: no
    # [N, L, K] copy per micro-batch (a batch without route rows is laid out: zeros)
    rows_N: torch.Tensor | None = None
    routes_NLK, replay_N = batch.values_NLK, batch.valid_N
    if attention_mask is not None:
        rows_N, replay_N = rows_for_padded(batch, attention_mask)
    else:
        assert position_ids is not None
        packed = _packed_rows(batch, position_ids)
        if packed is not None:
            rows_N, replay_N = packed[:2]
    if rows_N is not None and routes_NLK.shape[0] == 0:
        routes_NLK, rows_N = routes_NLK.new_zeros((rows_N.shape[0], *routes_NLK.shape[1:])), None
    controller.arm(
        microbatch,
        routes_NLK,
        layer_numbers=batch.meta.layer_numbers,
        replay_mask_T=replay_N,
        rows_T=rows_N,
        validate=False,  # a RouteBatch is validated when it is built
        ids_validated=batch.ids_validated,  # on its valid rows, the only ones replay_N marks
    )
    expect_packed(controller, microbatch, routes_NLK, position_ids)


def end_failed_step(controller: ReplayController) -> None:
    """End the step of a pass that raised: targets, records and counters cleared as
    ``end_step`` clears them, targets left unused warned about rather than raised (the pass's
    own error is the one to see)."""
    controller.strict, strict = False, controller.strict
    try:
        controller.end_step()
    finally:
        controller.strict = strict
