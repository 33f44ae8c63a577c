"""G1 / C4: expert-bias token counts under replay with a replay mask (C4: rows not replayed
leave the counts when asked, compiled or not), and with Megatron's own
``padding_mask`` on the lines whose routing takes one (0.16+), for T == E and T != E tokens.

Megatron 0.16 - 0.19.2 combine the routing map ``[T, E]`` with ``~padding_mask`` ``[T]``
without ``unsqueeze`` (Megatron #6114): an error when T != E, silently wrong counts when
T == E. The first test observes that in Megatron's own code where the version data says so
(and its absence elsewhere); the others check that rr's counts are exact on every line.

Shapes: B batch, S sequence, T = S * B router rows (sequence-major), E experts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, inputs, map_of, random_targets, routers, step
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.megatron import gpt_inputs, route_log
from rr_megatron_compat import _stats

#: (batch, seq): T = 8 == E rows, and T = 16 != E rows.
SHAPES: dict[str, tuple[int, int]] = {"T==E": (1, E), "T!=E": (2, 8)}


def _flags() -> Any:
    return rmc.megatron_line()


def _mask_T(rows: int) -> torch.Tensor:
    """Rows with a captured route: every third row has none (so padded rows sit at different
    token and expert positions)."""
    mask_T = torch.ones(rows, dtype=torch.bool)
    mask_T[1::3] = False
    return mask_T


def _padding_BS(mask_T: torch.Tensor, batch: int) -> torch.Tensor:
    """Megatron's ``padding_mask`` ([B, S] as input_ids, True on padding) for router rows
    ``mask_T`` (row ``s * B + b``)."""
    return (~mask_T).view(-1, batch).t().contiguous()


@contextmanager
def biased_replay(ignore: bool) -> Iterator[tuple[Any, ReplayController]]:
    """A sigmoid router model with expert bias, attached and in REPLAY, every router's
    ``local_tokens_per_expert`` zeroed; detached on exit."""
    model = build(score_function="sigmoid", expert_bias=True)
    controller = ReplayController(num_experts=E, top_k=K)
    rmc.attach(controller, model, ignore_unreplayed_in_stats=ignore)
    try:
        for _, router in routers(model):
            router.local_tokens_per_expert.zero_()
        controller.set_mode(ReplayMode.REPLAY)
        yield model, controller
    finally:
        controller.detach()


def _forward_backward(
    model: Any, controller: ReplayController, data: dict[str, torch.Tensor]
) -> None:
    """One micro-batch forward and backward with the extra keyword ``padding_mask`` that the
    schedule in rr_fakes does not pass."""
    with controller.microbatch(0) as mb:
        output = model(
            data["input_ids"],
            data["position_ids"],
            attention_mask=None,
            labels=data["labels"],
            **({"padding_mask": data["padding_mask"]} if "padding_mask" in data else {}),
        )
        mb.track(output)
    output.float().mean().backward()


def test_G1_megatrons_own_update_is_wrong_where_the_version_data_says(megatron: None) -> None:
    """Megatron's ``_apply_expert_bias`` itself (no rr): with a padding mask it raises for
    T != E and miscounts for T == E exactly on the lines the flag names; lines before 0.16
    take no padding mask there (0.12 counts inline in ``routing``)."""
    model = build(score_function="sigmoid", expert_bias=True)
    (_, router), *_ = routers(model)
    update = getattr(type(router), "_apply_expert_bias", None)  # inline in routing on 0.12
    takes_mask = update is not None and "padding_mask" in inspect.signature(update).parameters
    assert takes_mask == _flags().padding_mask
    if not takes_mask:
        assert not _flags().expert_bias_padding_unbroadcast
        return
    g = torch.Generator().manual_seed(0)
    for name, (batch, seq) in SHAPES.items():
        rows = batch * seq
        map_TE = torch.zeros(rows, E, dtype=torch.bool)
        map_TE.scatter_(1, torch.rand(rows, E, generator=g).topk(K, dim=1).indices, True)
        padding_T = ~_mask_T(rows)
        want_E = (map_TE & ~padding_T.unsqueeze(-1)).sum(dim=0).float()
        router.local_tokens_per_expert.zero_()
        try:
            router._apply_expert_bias(map_TE, padding_mask=padding_T)
        except RuntimeError:  # torch.compile wraps the broadcast error in its own subclasses
            outcome = "raises"
        else:
            right = torch.equal(router.local_tokens_per_expert, want_E)
            outcome = "right" if right else "wrong"
        expected = "right"
        if _flags().expert_bias_padding_unbroadcast:
            expected = "wrong" if rows == E else "raises"
        assert outcome == expected, (name, _flags().version)


@pytest.mark.parametrize("ignore", [True, False], ids=["ignore-unreplayed", "count-all"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_G1_C4_expert_bias_counts_are_exact_with_replay_and_padding_masks(
    megatron: None, shape: str, ignore: bool
) -> None:
    """Replay with a replay mask; on 0.16+ the unreplayed rows also go to Megatron as its
    ``padding_mask`` (rows it leaves out of its aux-loss and expert-bias statistics). Every
    router's ``local_tokens_per_expert`` then equals the routing map summed over the rows that
    count: the replayed rows where either mask applies, every row otherwise."""
    batch, seq = SHAPES[shape]
    rows = batch * seq
    with biased_replay(ignore) as (model, controller):
        mask_T = _mask_T(rows)
        data = gpt_inputs(batch, seq, 64)
        if _flags().padding_mask:
            data["padding_mask"] = _padding_BS(mask_T, batch)
        targets = random_targets(rows, len(controller.layer_numbers), seed=3)
        controller.arm(0, targets, layer_numbers=controller.layer_numbers, replay_mask_T=mask_T)
        with route_log(model) as log:
            _forward_backward(model, controller, data)
        controller.end_step()
        counted_T = mask_T if (ignore or "padding_mask" in data) else torch.ones_like(mask_T)
        for slot, (layer, router) in enumerate(routers(model)):
            (map_TE,) = log.forward[layer]
            assert torch.equal(map_TE[mask_T], map_of(targets[mask_T, slot].long()))  # replayed
            want_E = map_TE[counted_T].sum(dim=0).float()
            assert torch.equal(router.local_tokens_per_expert, want_E), (layer, shape)


def test_G1_workaround_follows_the_version_flag(
    megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the flag forced off, a line whose Megatron has the bug shows it again through rr
    (so the test above fails on the released code without the workaround); with the flag
    forced on, a line without the bug (or without a padding mask) counts the same."""
    flags = _flags()
    if not flags.padding_mask:
        forced = dataclasses.replace(flags, expert_bias_padding_unbroadcast=True)
        monkeypatch.setattr(_stats, "megatron_line", lambda: forced)
        test_G1_C4_expert_bias_counts_are_exact_with_replay_and_padding_masks(None, "T!=E", True)
        return
    off = dataclasses.replace(flags, expert_bias_padding_unbroadcast=False)
    monkeypatch.setattr(_stats, "megatron_line", lambda: off)
    if flags.expert_bias_padding_unbroadcast:
        with pytest.raises(RuntimeError):
            test_G1_C4_expert_bias_counts_are_exact_with_replay_and_padding_masks(
                None, "T!=E", True
            )
        with pytest.raises(AssertionError):
            test_G1_C4_expert_bias_counts_are_exact_with_replay_and_padding_masks(
                None, "T==E", True
            )
    else:  # a line with Megatron's fix: its own update is right
        test_G1_C4_expert_bias_counts_are_exact_with_replay_and_padding_masks(None, "T!=E", True)


def expert_bias_counts(ignore: bool) -> list[int]:
    """Each router's local_tokens_per_expert after one step replaying 10 of 16 rows."""
    with biased_replay(ignore) as (model, controller):
        mask = torch.zeros(16, dtype=torch.bool)
        mask[:10] = True
        controller.arm(
            0, random_targets(16, 4), layer_numbers=controller.layer_numbers, replay_mask_T=mask
        )
        step(model, inputs(1), controller)
        controller.end_step()
        return [int(r.local_tokens_per_expert.sum()) for _, r in routers(model)]


@pytest.mark.parametrize("ignore", [False, True])
def test_C4_expert_bias_counts_skip_rows_that_were_not_replayed(
    megatron: None, ignore: bool
) -> None:
    assert expert_bias_counts(ignore) == [(10 if ignore else 16) * K] * 4


def test_C4_counts_hold_where_megatron_compiles_its_expert_bias_update(megatron: None) -> None:
    """Megatron compiles ``_apply_expert_bias`` (its jit_fuser) where torch has torch.compile;
    the CPU harness runs it eagerly unless asked, so this test asks."""
    from megatron.core.transformer.moe.router import TopKRouter

    from rr_fakes.shims.megatron import megatron_compiled

    update = getattr(TopKRouter, "_apply_expert_bias", None)
    if update is None or not hasattr(update, "_torchdynamo_orig_callable"):
        pytest.skip("this megatron-core line does not compile its expert-bias update")
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # a compiled frame cached by an earlier test would hide this one's
    frames = counters["frames"]["ok"]
    with megatron_compiled():
        assert expert_bias_counts(True) == [10 * K] * 4
    assert counters["frames"]["ok"] > frames  # dynamo compiled Megatron's update
