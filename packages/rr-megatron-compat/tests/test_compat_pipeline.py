"""Recorded routes across pipeline stages: per-chunk records merged onto the global MoE-layer
axis in layer order (A3), and the PP gather in which a rank without MoE layers still takes part
(A6), with a real GPTModel under Megatron's interleaved (VPP) schedule on two gloo ranks."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch

from rr_core import LayoutConfig, LayoutError, moe_layer_numbers, select_stage
from rr_megatron_compat._pipeline import (
    merge_stage_routes,
    pp_gather,
    rank_moe_layer_numbers,
    split_rank_routes,
    stack_rank_routes,
)

launch = pytest.importorskip("rr_fakes.shims.megatron").launch

MIXED = [0, 1, 1, 0, 1, 0, 1, 1]  # dense and MoE layers mixed over pp=2 x vp=2 chunks


def megatron_available() -> bool:
    """Checked when a test runs, not at import: spawned ranks re-import this module."""
    from rr_fakes.shims.megatron import unavailable_reason

    return unavailable_reason() is None


def global_routes(T: int, M: int, K: int = 2) -> torch.Tensor:
    """Distinct ids per (token, MoE slot), so any misplacement shows."""
    return (torch.arange(T * M * K).reshape(T, M, K) % 30000).to(torch.int16)


# -- pure layout ----------------------------------------------------------------------------------


def test_A3_vpp_records_merge_by_moe_ordinals_not_layer_offsets() -> None:
    cfg = LayoutConfig(num_layers=8, moe_layer_freq=MIXED, pp_size=2, vp_size=2)
    G = global_routes(3, sum(MIXED))
    numbers = moe_layer_numbers(cfg)
    blocks: dict[tuple[int, int | None], torch.Tensor] = {}
    for rank in range(2):
        mine = rank_moe_layer_numbers(cfg, rank)
        # recorded in some execution order, keyed by global layer number
        records = {n: G[:, numbers.index(n)] for n in reversed(mine)}
        blocks.update(split_rank_routes(stack_rank_routes(records, cfg, rank), cfg, rank))
    assert rank_moe_layer_numbers(cfg, 0) == (2, 5)
    assert rank_moe_layer_numbers(cfg, 1) == (3, 7, 8)
    assert torch.equal(merge_stage_routes(blocks, cfg), G)
    for (rank, vp), block in blocks.items():
        assert torch.equal(block, select_stage(G, cfg, "moe_layers", rank, vp))


def test_A3_records_that_do_not_match_the_rank_are_refused() -> None:
    cfg = LayoutConfig(num_layers=8, moe_layer_freq=MIXED, pp_size=2, vp_size=2)
    records = {n: torch.zeros(3, 2, dtype=torch.int16) for n in (2, 3)}
    with pytest.raises(LayoutError, match="MoE layers"):
        stack_rank_routes(records, cfg, 0)


def test_A6_a_rank_without_moe_layers_stacks_to_none() -> None:
    cfg = LayoutConfig(num_layers=4, moe_layer_freq=[1, 1, 0, 0], pp_size=2)
    assert stack_rank_routes({}, cfg, 1) is None


# -- two gloo ranks -------------------------------------------------------------------------------


def a6_gathers() -> dict[str, Any]:
    """A6 over the plain gloo world: PP=2 where rank 1 holds only dense layers (in uint8 and
    int16), then a gather whose ranks disagree on the token count."""
    import torch.distributed as dist

    rank = dist.get_rank()
    cfg = LayoutConfig(num_layers=4, moe_layer_freq=[1, 1, 0, 0], pp_size=2)
    out: dict[str, Any] = {}
    for dtype in (torch.int16, torch.uint8):
        G = global_routes(5, 2).to(dtype)
        got = pp_gather(G if rank == 0 else None, cfg, dist.group.WORLD)
        out[str(dtype)] = (got.tolist(), str(got.dtype))  # plain data outlives the rank
    even = LayoutConfig(num_layers=2, moe_layer_freq=1, pp_size=2)
    try:
        pp_gather(torch.zeros(4 + rank, 1, 2, dtype=torch.int16), even, dist.group.WORLD)
    except LayoutError as error:
        out["mismatch"] = str(error)
    return out


def test_A6_pp2_gather_with_a_rank_without_moe_layers() -> None:
    for result in launch(a6_gathers, 2, timeout_s=60):
        for dtype in (torch.int16, torch.uint8):
            routes, got_dtype = result[str(dtype)]
            assert got_dtype == str(dtype)  # narrow on the wire and after it
            assert routes == global_routes(5, 2).to(dtype).tolist()
        assert "disagree" in result["mismatch"]  # every rank raises, none hangs


def interleaved_record() -> dict[str, Any]:
    """Real GPTModel chunks under Megatron's interleaved 1F1B schedule; each router records the
    ids it chose per micro-batch, keyed by its global layer number."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rr_core import walk_routers
    from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt_chunks, gpt_inputs, train_step
    from rr_megatron_compat._layout import layout_config

    chunks = build_gpt_chunks(TinyGPTConfig(num_layers=8, moe_layer_freq=MIXED))
    cfg = layout_config(chunks[0].config)
    records: dict[int, dict[int, torch.Tensor]] = defaultdict(dict)
    fired: list[int] = []

    def hook(layer: int) -> Any:
        def record(module: Any, args: Any, output: Any) -> None:
            routing_map = output[1] if isinstance(output, tuple) else output
            T, _ = routing_map.shape
            mb = sum(1 for n in fired if n == layer)
            records[mb][layer] = routing_map.nonzero()[:, 1].reshape(T, -1).to(torch.int16)
            fired.append(layer)

        return record

    for layer, router in walk_routers(chunks):
        router.register_forward_hook(hook(layer))
    train_step(chunks, [gpt_inputs(1, 8, 64, seed=i) for i in range(4)])
    pp_rank = ps.get_pipeline_model_parallel_rank()
    gathered = [
        pp_gather(stack_rank_routes(records[mb], cfg, pp_rank), cfg) for mb in sorted(records)
    ]
    return {  # plain data: tensors do not outlive the rank process
        "rank": dist.get_rank(),
        "records": {mb: {n: t.tolist() for n, t in r.items()} for mb, r in records.items()},
        "gathered": [g.tolist() for g in gathered],
        "moe_layers": moe_layer_numbers(cfg),
    }


def test_A3_vpp2_interleaved_schedule_records_gather_in_layer_order() -> None:
    if not megatron_available():
        pytest.skip("megatron-core unavailable")
    from rr_fakes.shims.megatron import ParallelSizes

    results = launch(interleaved_record, 2, sizes=ParallelSizes(pp=2, vpp=2), timeout_s=180)
    numbers = results[0]["moe_layers"]
    assert numbers == (2, 3, 5, 7, 8)
    for mb in range(4):
        every = {**results[0]["records"][mb], **results[1]["records"][mb]}
        expected = torch.stack([torch.tensor(every[n]) for n in numbers], dim=-2).tolist()
        assert results[0]["gathered"][mb] == expected
        assert results[1]["gathered"][mb] == expected
