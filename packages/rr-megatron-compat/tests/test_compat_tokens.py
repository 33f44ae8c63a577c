"""Routes in the model's token layout: router row order, sequence parallelism with alignment
padding (D5), context-parallel zigzag / contiguous layouts (D6), THD packing, and the same moves
through real gloo collectives (int16 payloads as uint8 views). The pure-torch and gloo parts run
without Megatron; the comparisons with Megatron's own splitting functions run where it is
installed."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rr_core import AlignmentError
from rr_megatron_compat._tokens import (
    batch_to_router_rows,
    cp_gather,
    cp_merge,
    cp_split,
    packed_seq_params,
    router_rows_to_batch,
    sp_alignment,
    sp_gather,
    sp_pad,
    sp_scatter,
    thd_cp_index,
    thd_pack,
    thd_unpack,
)
from rr_megatron_compat._wire import all_gather_exact, as_wire_bytes, from_wire_bytes

launch = pytest.importorskip("rr_fakes.shims.megatron").launch


def routes(
    T: int, L: int = 3, K: int = 2, *, dtype: torch.dtype = torch.int16, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-32768, 32767, (T, L, K), generator=g).to(dtype)


def megatron_available() -> bool:
    """Checked when a test runs, not at import: spawned ranks re-import this module."""
    from rr_fakes.shims.megatron import unavailable_reason

    return unavailable_reason() is None


def needs_megatron() -> None:
    if not megatron_available():
        pytest.skip("megatron-core unavailable")


# -- pure torch -----------------------------------------------------------------------------------


def test_router_rows_are_sequence_major_like_megatrons_hidden_states() -> None:
    r_BSLK = routes(2 * 5).reshape(2, 5, 3, 2)
    hidden_SBH = r_BSLK.transpose(0, 1)  # Megatron's [S, B, ...]; the router sees view(-1, H)
    rows = batch_to_router_rows(r_BSLK)
    assert torch.equal(rows, hidden_SBH.reshape(10, 3, 2))
    assert torch.equal(router_rows_to_batch(rows, 2), r_BSLK)


def test_D5_sp_padding_appends_and_never_shifts_rows() -> None:
    r, mask = routes(7), torch.ones(7, dtype=torch.bool)
    padded, pmask = sp_pad(r, mask, tp_size=2, cp_size=2)
    assert padded.shape[0] == 8 == sp_alignment(2, 2)
    assert torch.equal(padded[:7], r)
    assert pmask.tolist() == [True] * 7 + [False]
    assert sp_alignment(4) == 4


def test_D5_sp_scatter_refuses_unaligned_rows() -> None:
    with pytest.raises(AlignmentError, match="sp_pad"):
        sp_scatter(routes(7), 0, 2)
    parts = [sp_scatter(routes(8), r, 4) for r in range(4)]
    assert torch.equal(torch.cat(parts), routes(8))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [1, 2, 3])
def test_D6_cp_split_and_merge_round_trip(layout: Any, cp: int) -> None:
    seq = routes(12)
    parts = [cp_split(seq, r, cp, layout=layout) for r in range(cp)]
    assert torch.equal(cp_merge(parts, layout=layout), seq)


def test_D6_zigzag_holds_chunks_r_and_2cp_minus_1_minus_r() -> None:
    seq = torch.arange(8)
    assert cp_split(seq, 0, 2).tolist() == [0, 1, 6, 7]
    assert cp_split(seq, 1, 2).tolist() == [2, 3, 4, 5]
    assert cp_split(seq, 1, 2, layout="contiguous").tolist() == [4, 5, 6, 7]
    with pytest.raises(AlignmentError, match="equal chunks"):
        cp_split(torch.arange(6), 0, 2)


def test_D5_thd_pack_puts_each_sequence_at_its_padded_start() -> None:
    seqs = [routes(3, seed=1), routes(5, seed=2), routes(1, seed=3)]
    packed = thd_pack(seqs, align=4)
    assert packed.cu_seqlens.tolist() == [0, 3, 8, 9]
    assert packed.cu_seqlens_padded.tolist() == [0, 4, 12, 16]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 8
    assert packed.mask_T.tolist() == [1, 1, 1, 0] + [1] * 5 + [0] * 3 + [1, 0, 0, 0]
    for got, want in zip(thd_unpack(packed), seqs, strict=True):
        assert torch.equal(got, want)


def test_D6_thd_cp_index_zigzags_each_sequence_and_covers_every_row_once() -> None:
    packed = thd_pack([routes(3), routes(4)], align=sp_alignment(1, 2))
    assert packed.cu_seqlens_padded.tolist() == [0, 4, 8]
    index = [thd_cp_index(packed.cu_seqlens_padded, r, 2).tolist() for r in range(2)]
    assert index == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert sorted(index[0] + index[1]) == list(range(8))


def test_int16_bytes_view_round_trips_bit_exactly() -> None:
    r = routes(5)
    wire = as_wire_bytes(r)
    assert wire.dtype == torch.uint8
    assert wire.numel() == r.numel() * 2
    assert torch.equal(from_wire_bytes(wire, r.dtype, tuple(r.shape)), r)


# -- gloo collectives -----------------------------------------------------------------------------


def gloo_moves() -> dict[str, Any]:
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    full = routes(8, seed=7)
    out: dict[str, Any] = {}
    # gloo itself rejects int16 all_gather; the uint8 view goes through.
    try:
        dist.all_gather([torch.empty_like(full) for _ in range(size)], full)
        out["raw_int16"] = "accepted"
    except (RuntimeError, TypeError) as error:
        out["raw_int16"] = str(error)[:80]
    out["exact"] = all(torch.equal(p, full) for p in all_gather_exact(full))
    out["sp"] = torch.equal(sp_gather(sp_scatter(full, rank, size), group=dist.group.WORLD), full)
    for layout in ("zigzag", "contiguous"):
        local = cp_split(full, rank, size, layout=layout)  # type: ignore[arg-type]
        out[layout] = torch.equal(cp_gather(local, dist.group.WORLD, layout=layout), full)  # type: ignore[arg-type]
    return out


def test_D6_sp_and_cp_gathers_over_two_gloo_ranks_are_bit_exact() -> None:
    for result in launch(gloo_moves, 2, timeout_s=60):
        assert result["exact"]
        assert result["sp"]
        assert result["zigzag"]
        assert result["contiguous"]
        assert result["raw_int16"] != "accepted"  # why payloads travel as uint8 views


# -- against Megatron's own functions -------------------------------------------------------------


class _NoPinnedMemory(TorchFunctionMode):
    """Drops ``pin_memory=True`` (a transfer hint; a CPU-only build refuses it)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


def megatron_moves() -> dict[str, Any]:
    import torch.distributed as dist

    from rr_fakes.shims.megatron import megatron_cpu

    out: dict[str, Any] = {}
    with megatron_cpu():
        ps = importlib.import_module("megatron.core.parallel_state")
        mappings = importlib.import_module("megatron.core.tensor_parallel.mappings")
        utils = importlib.import_module("megatron.core.utils")
        rank = dist.get_rank()
        full = routes(8, seed=11)
        ps.initialize_model_parallel(tensor_model_parallel_size=2)
        try:
            theirs = mappings.scatter_to_sequence_parallel_region(full.float())
            out["sp_scatter"] = torch.equal(sp_scatter(full, rank, 2).float(), theirs)
            out["sp_gather"] = torch.equal(sp_gather(sp_scatter(full, rank, 2)), full)
        finally:
            ps.destroy_model_parallel()
        ps.initialize_model_parallel(context_parallel_size=2)
        try:
            batch = {"tokens": full.reshape(1, 8, -1).clone(), "cu_seqlens": None}
            params = inspect.signature(utils.get_batch_on_this_cp_rank).parameters
            if "is_hybrid_cp" in params:
                split = utils.get_batch_on_this_cp_rank(
                    batch, is_hybrid_cp=False, cp_group=ps.get_context_parallel_group()
                )
            else:
                batch.pop("cu_seqlens")
                with _NoPinnedMemory():  # 0.12 pins its index tensor, which needs an accelerator
                    split = utils.get_batch_on_this_cp_rank(batch)
            mine = cp_split(full, rank, 2)
            out["cp_split"] = torch.equal(mine.reshape(1, 4, -1), split["tokens"])
            out["cp_gather"] = torch.equal(cp_gather(mine), full)
        finally:
            ps.destroy_model_parallel()
    return out


def test_D6_zigzag_and_sp_split_equal_megatrons_own_functions() -> None:
    needs_megatron()
    for result in launch(megatron_moves, 2, timeout_s=120):
        assert result == {
            "sp_scatter": True,
            "sp_gather": True,
            "cp_split": True,
            "cp_gather": True,
        }


def test_thd_pack_builds_megatrons_packed_seq_params() -> None:
    needs_megatron()
    from rr_fakes.shims.megatron import megatron_cpu

    packed = thd_pack([routes(3), routes(5)], align=2)
    with megatron_cpu():
        params = packed_seq_params(packed)
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == [0, 3, 8]
    assert params.cu_seqlens_q_padded.tolist() == [0, 4, 10]
    assert params.max_seqlen_q == 6
