"""verl 0.9.1's engine with rr on two gloo ranks: R2 record -> replay through PP=2 1F1B and
PP=2 x VPP=2 interleaved (with full recompute), and dynamic context parallelism: rr's router
rows for a micro-batch's ``local_cp_size`` equal verl's own THD packing, and gather back.

Skipped where verl or megatron-core cannot be imported (the ``verl`` nox session has both)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

TIMEOUT_S = 300


def _reason() -> str | None:
    from rr_fakes.shims.megatron import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        from rr_fakes.shims.verl import unavailable_reason as verl_reason

        reason = verl_reason()
    return reason


@pytest.fixture(autouse=True)
def _needs_verl() -> None:
    reason = _reason()
    if reason is not None:
        pytest.skip(reason)


def _switch() -> tuple[Any, Any]:
    import rr_megatron_compat.verl as rv

    return rv.install, rv.uninstall


@pytest.mark.parametrize("recompute", [False, True])
def test_R2_pp2_1f1b_through_verls_engine_with_rr(recompute: bool) -> None:
    from rr_fakes.shims.megatron import ParallelSizes, launch
    from rr_fakes.shims.verl import pipeline_r2_rank

    results = launch(
        pipeline_r2_rank, 2, 4, recompute, _switch(), sizes=ParallelSizes(pp=2), timeout_s=TIMEOUT_S
    )
    assert results == [(0, [1, 2], True, True, 4), (1, [3, 4], True, True, 4)]


def test_R2_pp2_vpp2_interleaved_through_verls_engine_with_rr() -> None:
    from rr_fakes.shims.megatron import ParallelSizes, launch
    from rr_fakes.shims.verl import pipeline_r2_rank

    results = launch(
        pipeline_r2_rank,
        2,
        8,
        True,
        _switch(),
        sizes=ParallelSizes(pp=2, vpp=2),
        timeout_s=TIMEOUT_S,
    )
    assert results == [(0, [1, 2, 5, 6], True, True, 8), (1, [3, 4, 7, 8], True, True, 8)]


def dynamic_cp_rank(local_cp_size: int) -> tuple[bool, bool, int]:
    """(rr's rows == verl's, rr's gather restores every sequence, rows on this rank). Megatron
    0.19.2 has no dynamic CP groups; they are stood in for as verl's scheduler builds them: the
    ranks that share a micro-batch (here the world, or each rank alone)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rr_fakes.shims.megatron import megatron_cpu
    from rr_megatron_compat.verl._rows import from_router_rows, to_router_rows

    with megatron_cpu():
        util = __import__("verl.models.mcore.util", fromlist=["preprocess_thd_engine"])
        singles = [dist.new_group([r]) for r in range(dist.get_world_size())]

        def groups(group_size: int) -> Any:
            return dist.group.WORLD if group_size > 1 else singles[dist.get_rank()]

        ps.get_dynamic_data_context_parallel_groups = groups
        try:
            g = torch.Generator().manual_seed(5)
            lengths = [7, 12, 3, 9]
            routes = torch.nested.as_nested_tensor(
                [torch.randint(0, 8, (n, 3, 2), generator=g).to(torch.int16) for n in lengths],
                layout=torch.jagged,
            )
            theirs, _, _ = util.preprocess_thd_engine(
                routes, pre_process=True, local_cp_size=local_cp_size
            )
            tf = SimpleNamespace(fp8=None, sequence_parallel=False)
            ours, _mask = to_router_rows(routes, None, None, tf, local_cp_size)
            same = bool(torch.equal(ours, theirs.squeeze(0)))
            input_ids = torch.nested.as_nested_tensor(
                [torch.arange(n) for n in lengths], layout=torch.jagged
            )
            back = from_router_rows(ours, input_ids, None, tf, local_cp_size)
            restored = bool(torch.equal(back.values(), routes.values()))
            return same, restored, int(ours.shape[0])
        finally:
            del ps.get_dynamic_data_context_parallel_groups


@pytest.mark.parametrize("local_cp_size", [1, 2])
def test_dynamic_cp_rows_equal_verls_packing_and_gather_back(local_cp_size: int) -> None:
    from rr_fakes.shims.megatron import ParallelSizes, launch

    results = launch(dynamic_cp_rank, 2, local_cp_size, sizes=ParallelSizes(), timeout_s=TIMEOUT_S)
    assert all(same and restored for same, restored, _ in results)
    rows = [n for _, _, n in results]
    # whole on each rank, or padded to 2 x cp rows per sequence (zigzag) and split in two
    assert rows == ([7 + 12 + 3 + 9] * 2 if local_cp_size == 1 else [18, 18])


def test_dynamic_cp_without_megatrons_groups_raises_naming_them() -> None:
    from rr_fakes.shims.megatron import model_parallel
    from rr_megatron_compat import ReplayConfigError
    from rr_megatron_compat.verl._rows import to_router_rows

    with model_parallel():
        from megatron.core import parallel_state as ps

        if hasattr(ps, "get_dynamic_data_context_parallel_groups"):
            pytest.skip("this megatron-core has dynamic CP groups")
        routes = torch.nested.as_nested_tensor(
            [torch.zeros(4, 2, 2, dtype=torch.int16)], layout=torch.jagged
        )
        tf = SimpleNamespace(fp8=None, sequence_parallel=False)
        with pytest.raises(ReplayConfigError, match="get_dynamic_data_context_parallel_groups"):
            to_router_rows(routes, None, None, tf, 2)


def duck_pp_gather_rank() -> tuple[list[Any], list[Any], bool]:
    """rr's pp_gather with a config of only the pipeline fields (what verl's callers pass):
    rank r holds r + 1 MoE layers of ids 10 * r + layer; dense and jagged maps."""
    import torch.distributed as dist

    import rr_megatron_compat.verl as rv
    from rr_fakes.shims.megatron import megatron_cpu

    with megatron_cpu():
        rank = dist.get_rank()
        layers = torch.arange(rank + 1, dtype=torch.int16) + 10 * rank  # [m]
        dense = layers.view(1, 1, -1, 1).expand(2, 3, -1, 2).contiguous()  # [B=2, S=3, m, K=2]
        jagged = torch.nested.nested_tensor_from_jagged(
            dense.reshape(6, -1, 2), torch.tensor([0, 2, 6])
        )
        cfg = SimpleNamespace(pipeline_model_parallel_size=2)
        out_dense = rv.pp_gather(dense, cfg)
        out_jagged = rv.pp_gather(jagged, cfg)
        same = bool(torch.equal(out_jagged.values(), out_dense.reshape(6, -1, 2)))
        return out_dense[0, 0, :, 0].tolist(), [out_dense.dtype, out_jagged.dtype], same


def test_pp_gather_with_only_the_pipeline_fields_concatenates_in_rank_order() -> None:
    from rr_fakes.shims.megatron import ParallelSizes, launch

    results = launch(duck_pp_gather_rank, 2, sizes=ParallelSizes(pp=2), timeout_s=TIMEOUT_S)
    for layers, dtypes, same in results:
        assert layers == [0, 10, 11]  # rank 0's one layer, then rank 1's two
        assert dtypes == [torch.int16, torch.int16]
        assert same
