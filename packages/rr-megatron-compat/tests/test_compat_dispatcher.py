"""C1 with the alltoall dispatcher: the routing map is counted on the host (a sync per layer on
an accelerator) only after a router replayed ids armed with validate=False."""

from __future__ import annotations

import pytest
import torch

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, capture_maps, inputs, random_targets, step
from rr_core import ReplayController, ReplayMode
from rr_megatron_compat import _dispatcher


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every host count of a routing map the alltoall hook makes, as it returns it."""
    counts: list[int] = []
    count = _dispatcher.routed_pairs

    def counting(routing_map_TE: torch.Tensor) -> int:
        counts.append(count(routing_map_TE))
        return counts[-1]

    monkeypatch.setattr(_dispatcher, "routed_pairs", counting)
    return counts


@pytest.mark.parametrize("masked", [False, True])
def test_targets_checked_at_arming_are_never_counted_on_the_host(
    megatron: None, counted: list[int], masked: bool
) -> None:
    model = build(dispatcher="alltoall")
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model)
    try:
        controller.set_mode(ReplayMode.REPLAY)
        mask = torch.ones(16, dtype=torch.bool)
        mask[-2:] = False  # R3: the last token of each sequence routes natively
        routes = random_targets(16, 4)
        layers = controller.layer_numbers
        controller.arm(0, routes, layer_numbers=layers, replay_mask_T=mask if masked else None)
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
    finally:
        controller.detach()
    assert counted == []
    for layer in layers:  # K experts on every row: Megatron's own T * K is the true size
        assert maps[layer][0].sum(dim=-1).tolist() == [K] * 16


def test_unchecked_targets_are_still_counted_and_a_repeated_id_sizes_the_output(
    megatron: None, counted: list[int]
) -> None:
    model = build(dispatcher="alltoall")
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model)
    try:
        dup = random_targets(16, 4)
        dup[3, 2, 1] = dup[3, 2, 0]  # layer 3, row 3 repeats an id: it sets one expert
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, dup, layer_numbers=controller.layer_numbers, validate=False)
        with capture_maps(model) as maps:
            step(model, inputs(1), controller)
        controller.end_step()
        # checked targets on the next step: no count, though the same hooks run
        controller.arm(0, random_targets(16, 4), layer_numbers=controller.layer_numbers)
        before = len(counted)
        step(model, inputs(1), controller)
        controller.end_step()
    finally:
        controller.detach()
    assert int(maps[3][0][3].sum()) == 1
    assert len(counted) == before  # nothing counted in the checked step
    assert counted == [16 * K] * 2 + [16 * K - 1] + [16 * K]  # one count per replayed layer
