"""The compiled replay pass answers ids it cannot replay as the torch path does: an
id >= E armed with ``validate=False, ids_validated=True``, or a checked batch edited in place
after arming, raises :class:`ReplayError` on every kernel, never torch's ``RuntimeError`` from
the gather."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rr_core import ReplayController, ReplayError, ReplayMode, RouteBatch, RouteMeta, kernels
from rr_fakes import distinct_ids

FAMILIES = kernels.KERNELS if kernels.numba_available() else ("numpy",)
E, K, T = 8, 2, 5


def controller() -> tuple[ReplayController, nn.Module]:
    routers = [nn.Linear(1, 1), nn.Linear(1, 1)]
    c = ReplayController(num_experts=E, top_k=K)
    c.attach(routers, walk=lambda _: [(1, routers[0]), (2, routers[1])])
    c.set_mode(ReplayMode.REPLAY)
    return c, routers[1]


@pytest.mark.parametrize("kernel", FAMILIES)
@pytest.mark.parametrize("bad_id", [E, E + 3, 255])
@pytest.mark.parametrize("masked", [False, True])
def test_an_out_of_range_id_armed_as_checked_raises_replay_error(
    kernel: str, bad_id: int, masked: bool
) -> None:
    routes_TLK = distinct_ids(T, 2, num_experts=E, top_k=K, seed=1).to(torch.uint8)
    routes_TLK[3, 1, 0] = bad_id
    mask_T = torch.tensor([True, False, True, True, True]) if masked else None
    c, router = controller()
    try:
        c.arm(
            0,
            routes_TLK,
            layer_numbers=(1, 2),
            replay_mask_T=mask_T,
            validate=False,
            ids_validated=True,
        )
        with kernels.use_kernel(kernel), pytest.raises(ReplayError, match=rf"outside \[0, {E}\)"):
            c.route(router, torch.rand(T, E), K)
    finally:
        c.detach()


@pytest.mark.parametrize("kernel", FAMILIES)
def test_a_checked_batch_edited_after_arming_raises_replay_error(
    kernel: str,
) -> None:
    meta = RouteMeta(num_experts=E, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2))
    routes_TLK = distinct_ids(T, 2, num_experts=E, top_k=K, seed=2).to(torch.uint8)
    batch = RouteBatch(routes_TLK.clone(), [0, T], None, meta)
    assert batch.ids_validated
    c, router = controller()
    try:
        c.arm_batch(0, batch)
        batch.values_NLK[2, 1] = torch.tensor([E + 1, 200], dtype=torch.uint8)  # in place
        with kernels.use_kernel(kernel), pytest.raises(ReplayError, match=rf"outside \[0, {E}\)"):
            c.route(router, torch.rand(T, E), K)
    finally:
        c.detach()
