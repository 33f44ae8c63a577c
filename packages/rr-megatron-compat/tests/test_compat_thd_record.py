"""G3: R2 record of packed (THD) micro-batches with several sequences each, inside real
megatron-core (``PackedSeqParams`` with ``qkv_format="thd"``; rr_fakes' per-sequence causal
attention stands in for Transformer Engine's). Every row of every packed sequence is recorded
(no sequence's record overwrites another's), and replay puts each sequence's routes back at
its own rows, here in a different packing than the record's, through backward recompute.

Shapes: T packed rows, L MoE layers, K top-k, E experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import rr_megatron_compat as rmc
from compat_megatron_steps import E, K, build, map_of, perturb
from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.megatron import route_log
from rr_fakes.shims.verl import use_thd_attention

VOCAB = 64
#: Sequence lengths; the record packs them as RECORD_PACKS, the replay as REPLAY_PACKS (lists of
#: sequence indices per micro-batch), each padded to its alignment.
LENGTHS = (5, 3, 6, 4, 7)
RECORD_PACKS, RECORD_ALIGN = ((0, 1, 2), (3, 4)), 4
REPLAY_PACKS, REPLAY_ALIGN = ((4, 0), (2, 1, 3)), 8


def _tokens(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]


def _pack(
    items: Sequence[torch.Tensor], align: int, routes: Sequence[torch.Tensor] | None = None
) -> tuple[rmc.PackedRoutes, dict[str, Any]]:
    """A THD micro-batch of ``items`` (token ids ``[T_i]``): its packed routes (``routes``, or
    placeholders that carry only the layout) and the model's inputs."""
    carried = routes if routes is not None else [torch.zeros(t.shape[0], 1, 1) for t in items]
    packed = rmc.thd_pack([r.long() for r in carried], align=align)
    rows = packed.rows_TLK.shape[0]
    ids = torch.zeros(rows, dtype=torch.long)
    positions = torch.zeros(rows, dtype=torch.long)
    for start, tokens in zip(packed.cu_seqlens_padded.tolist(), items, strict=False):
        ids[start : start + tokens.shape[0]] = tokens
        positions[start : start + tokens.shape[0]] = torch.arange(tokens.shape[0])
    data = {
        "input_ids": ids.unsqueeze(0),
        "position_ids": positions.unsqueeze(0),
        "labels": ids.roll(-1).unsqueeze(0),
        "packed_seq_params": rmc.packed_seq_params(packed),
    }
    return packed, data


def _step(model: Any, controller: ReplayController, batches: Sequence[dict[str, Any]]) -> None:
    """Forward and backward of each packed micro-batch inside ``controller.microbatch(i)``
    (the schedule in rr_fakes passes no ``packed_seq_params``)."""
    for index, data in enumerate(batches):
        with controller.microbatch(index) as mb:
            output = model(
                data["input_ids"],
                data["position_ids"],
                attention_mask=None,
                labels=data["labels"],
                packed_seq_params=data["packed_seq_params"],
            )
            mb.track(output)
        output.float().mean().backward()


def _spans(packed: rmc.PackedRoutes) -> list[slice]:
    starts = packed.cu_seqlens_padded.tolist()
    lengths = packed.cu_seqlens.diff().tolist()
    return [slice(s, s + n) for s, n in zip(starts, lengths, strict=False)]


def test_G3_packed_r2_records_every_row_of_every_sequence_and_replays_in_place(
    megatron: None,
) -> None:
    model = build(recompute=True)
    assert use_thd_attention([model]) == 4
    tokens = _tokens(seed=5)
    controller = ReplayController(num_experts=E, top_k=K)
    layers = rmc.attach(controller, model).layer_numbers
    try:
        packs = [_pack([tokens[i] for i in pack], RECORD_ALIGN) for pack in RECORD_PACKS]
        assert [p.mask_T.numel() for p, _ in packs] == [20, 12]  # padding between sequences
        controller.set_mode(ReplayMode.RECORD)
        with route_log(model) as native:
            _step(model, controller, [data for _, data in packs])
        recorded = [controller.recorded(mb) for mb in range(len(packs))]
        controller.end_step()

        # every packed row recorded, each sequence at its own rows, equal to what was routed
        per_sequence: dict[int, torch.Tensor] = {}
        for mb, ((packed, _), pack) in enumerate(zip(packs, RECORD_PACKS, strict=True)):
            assert tuple(recorded[mb].shape) == (packed.mask_T.numel(), len(layers), K)
            for slot, layer in enumerate(layers):
                native_TE = native.forward[layer][mb]
                assert torch.equal(map_of(recorded[mb][:, slot].long()), native_TE), (mb, layer)
            for seq, span in zip(pack, _spans(packed), strict=True):
                per_sequence[seq] = recorded[mb][span]
        assert sorted(per_sequence) == list(range(len(LENGTHS)))
        assert [r.shape[0] for _, r in sorted(per_sequence.items())] == list(LENGTHS)

        # replay each sequence's routes in another packing, after the routers changed
        perturb(model)
        replays = [
            _pack(
                [tokens[i] for i in pack],
                REPLAY_ALIGN,
                routes=[per_sequence[i] for i in pack],
            )
            for pack in REPLAY_PACKS
        ]
        controller.set_mode(ReplayMode.REPLAY)
        for mb, (packed, _) in enumerate(replays):
            controller.arm(mb, packed.rows_TLK, layer_numbers=layers, replay_mask_T=packed.mask_T)
        with route_log(model) as replayed:
            _step(model, controller, [data for _, data in replays])
        report = controller.end_step()
        assert min(report.agreement.values()) < 1.0  # the perturbation changed native routing
        for mb, ((packed, _), pack) in enumerate(zip(replays, REPLAY_PACKS, strict=True)):
            for slot, layer in enumerate(layers):
                # micro-batch by micro-batch: forward, then its backward recompute
                for map_TE in (replayed.forward[layer][mb], replayed.recompute[layer][mb]):
                    for seq, span in zip(pack, _spans(packed), strict=True):
                        want = map_of(per_sequence[seq][:, slot].long())
                        assert torch.equal(map_TE[span], want), (mb, layer, seq)
    finally:
        controller.detach()


def test_tokens_per_sample_flag_is_the_lines_own_fact(megatron: None) -> None:
    """0.19+ un-flattens packed batches for MoE layers; rr hooks that exactly where it exists."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    line = rmc.megatron_line()
    assert hasattr(TransformerLayer, "_maybe_unflatten_for_moe") == line.moe_unflatten_packed
    hooked = any(
        name.endswith("_maybe_unflatten_for_moe") for name in rmc.ADAPTER.installed_hooks()
    )
    assert hooked == line.moe_unflatten_packed


def test_tokens_per_sample_packed_rows_record_and_replay_in_packed_order(megatron: None) -> None:
    """With ``PackedSeqParams.tokens_per_sample`` (0.19+) the MoE layers route a packed batch
    of mbs samples as ``[S, mbs]`` rows. rr records and replays in packed order all the same:
    the record equals the record without tokens_per_sample, and replayed rows land on their
    own tokens, in forward and in backward recompute."""
    import dataclasses

    import pytest

    if not rmc.megatron_line().moe_unflatten_packed:
        pytest.skip("megatron-core before 0.19 has no tokens_per_sample")
    model = build(recompute=True)
    assert use_thd_attention([model]) == 4
    length = 6
    tokens = [t[:length] for t in _tokens(seed=9) if t.shape[0] >= length][:2]
    controller = ReplayController(num_experts=E, top_k=K)
    layers = rmc.attach(controller, model).layer_numbers
    try:
        packed, plain = _pack(tokens, align=1)
        per_sample = dict(plain)
        per_sample["packed_seq_params"] = dataclasses.replace(
            plain["packed_seq_params"], tokens_per_sample=length
        )
        records = []
        for data in (plain, per_sample):
            controller.set_mode(ReplayMode.RECORD)
            with route_log(model) as native:
                _step(model, controller, [data])
            records.append(controller.recorded(0))
            controller.end_step()
        # the router did route sample-minor rows under tokens_per_sample
        mbs = len(tokens)
        first = native.forward[layers[0]][0]
        assert not torch.equal(first, map_of(records[0][:, 0].long()))
        assert torch.equal(records[1], records[0])  # packed order, as without tokens_per_sample

        perturb(model)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, records[0], layer_numbers=layers, replay_mask_T=packed.mask_T)
        with route_log(model) as replayed:
            _step(model, controller, [per_sample])
        report = controller.end_step()
        assert min(report.agreement.values()) < 1.0
        for slot, layer in enumerate(layers):
            want = map_of(records[0][:, slot].long())
            for map_TE in (replayed.forward[layer][0], replayed.recompute[layer][0]):
                in_packed_order = map_TE.view(length, mbs, E).transpose(0, 1).reshape(-1, E)
                assert torch.equal(in_packed_order, want), layer
    finally:
        controller.detach()
    # the row order each router routed in is rr's own state, gone with uninstall
    from megatron.core.transformer.moe.router import TopKRouter

    from rr_megatron_compat._hooks import SAMPLE_MINOR

    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    assert routers
    assert all(r in SAMPLE_MINOR for r in routers)
    assert not [k for r in routers for k in vars(r) if k.startswith("_rr")]  # none on Megatron's
    rmc.uninstall()
    assert not any(r in SAMPLE_MINOR for r in routers)
