"""Compact routes for verl equal verl 0.9.1's own conversion of the same engine output, bit for
bit: ``AgentLoopOutput.as_dict`` + ``list_of_dict_to_tensordict`` (the jagged ``routed_experts``
field) and ``AgentLoopWorker._agent_loop_postprocess`` + ``_postprocess`` (the padded one) +
``left_right_2_no_padding``. Skipped where verl cannot be imported (the ``verl`` nox session has
it)."""

from __future__ import annotations

import itertools
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from rr_core import (
    CODECS,
    RouteMeta,
)
from rr_fakes.shims.verl import agent_loop_batch, agent_loop_worker
from rr_vllm import (
    EngineOutputError,
    assemble_multi_turn,
    pack_for_verl,
    to_verl_nested,
    to_verl_padded,
)
from verl_testing import (
    DENSE_FIRST,
    LAYOUTS,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    Rollout,
    as_codec,
    rollout,
    verl_modules,
)

# -- (b) against verl's own conversion -----------------------------------------------------------


@pytest.fixture(scope="module")
def verl() -> SimpleNamespace:
    return verl_modules()


def _outputs(verl: SimpleNamespace, r: Rollout, rows: list[Any] | None = None) -> list[Any]:
    al: ModuleType = verl.agent_loop
    return [
        al.AgentLoopOutput(
            prompt_ids=p,
            response_ids=g,
            response_mask=[1] * len(g),
            routed_experts=e,
            metrics=al.AgentLoopMetrics(),
        )
        for p, g, e in zip(r.prompts, r.responses, rows or r.engine_rows, strict=True)
    ]


def verl_jagged(verl: SimpleNamespace, r: Rollout, rows: list[Any] | None = None) -> torch.Tensor:
    """verl's TransferQueue path: per-sample ``as_dict``, then ``list_of_dict_to_tensordict``."""
    fields = [o.as_dict() for o in _outputs(verl, r, rows)]
    out: torch.Tensor = verl.list_of_dict_to_tensordict(fields)["routed_experts"]
    return out


def verl_padded_batch(
    verl: SimpleNamespace, r: Rollout, prompt_length: int, response_length: int
) -> Any:
    """verl's DataProto path: ``_agent_loop_postprocess`` per sample, then ``_postprocess``."""
    worker = agent_loop_worker(prompt_length=prompt_length, response_length=response_length)
    return agent_loop_batch(worker, _outputs(verl, r)).batch


@pytest.fixture(
    params=list(itertools.product(["vllm_int32", "vllm_uint8", "sglang"], LAYOUTS, CODECS)),
    ids="-".join,
)
def verl_case(request: pytest.FixtureRequest) -> tuple[Rollout, RouteMeta, str]:
    """A rollout in each engine format verl reads (fmt), over each layout, and a codec."""
    fmt, layout, codec = request.param
    meta = LAYOUTS[layout]
    return rollout(fmt, meta), meta, codec


def test_nested_equals_verl_transfer_queue_path(
    verl: SimpleNamespace, verl_case: tuple[Rollout, RouteMeta, str]
) -> None:
    r, meta, codec = verl_case
    theirs = verl_jagged(verl, r)
    ours = to_verl_nested(pack_for_verl(r.samples, meta, codec=codec))
    assert theirs.is_nested
    assert theirs.layout == ours.layout == torch.jagged
    assert ours.dtype == theirs.dtype == torch.int16
    assert ours.offsets().dtype == theirs.offsets().dtype
    assert torch.equal(ours.offsets(), theirs.offsets())
    assert torch.equal(ours.values(), as_codec(theirs.values(), codec))
    for a, b in zip(ours.unbind(), theirs.unbind(), strict=True):
        assert a.shape == b.shape


def test_padded_equals_verl_dataproto_path(
    verl: SimpleNamespace, verl_case: tuple[Rollout, RouteMeta, str]
) -> None:
    r, meta, codec = verl_case
    batch = verl_padded_batch(verl, r, PROMPT_LENGTH, RESPONSE_LENGTH)
    routes = pack_for_verl(r.samples, meta, codec=codec)
    padded = to_verl_padded(routes, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    theirs = batch["routed_experts"]
    assert padded.dtype == theirs.dtype == torch.int16
    assert padded.shape == theirs.shape
    assert torch.equal(padded, as_codec(theirs, codec))
    # the trainer cuts the padded batch to the same jagged tensor (its offsets are int32)
    cut = verl.left_right_2_no_padding(batch.clone())["routed_experts"]
    nested = to_verl_nested(routes)
    assert torch.equal(nested.offsets(), cut.offsets().to(torch.int64))
    assert torch.equal(nested.values(), as_codec(cut.values(), codec))


def test_verl_trainer_accepts_it_and_replays_only_routed_rows(verl: SimpleNamespace) -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    batch = verl_padded_batch(verl, r, PROMPT_LENGTH, RESPONSE_LENGTH)
    cut = verl.left_right_2_no_padding(batch.clone())
    routes = pack_for_verl(r.samples, DENSE_FIRST)
    aligned = verl.replay.align_r3_router_replay_data(to_verl_nested(routes), cut["input_ids"])
    assert torch.equal(aligned.values(), to_verl_nested(routes).values())
    mask = verl.replay.build_r3_replay_mask(cut["input_ids"], batch["response_mask"]).values()
    valid = torch.cat([torch.from_numpy(s.valid_T) for s in r.samples if s is not None])
    assert torch.equal(mask, valid)  # verl replays exactly the rows that carry a route


def test_multi_turn_tool_rows_verl_replays_as_expert_zero(verl: SimpleNamespace) -> None:
    """A trajectory ending in tool tokens: verl zero-fills their rows and its replay mask keeps
    them; rr refuses by default and gives verl's tensor with ``strict=False``."""
    r = rollout("vllm_uint8", DENSE_FIRST, shapes=[(5, 4), (3, 2)])
    turn = r.samples[0]
    assert turn is not None
    extra = 3
    r.responses[0] = r.responses[0] + [7] * extra
    r.samples[0] = assemble_multi_turn(turn, num_tokens=9 + extra, num_prompt_tokens=5)
    theirs = verl_jagged(verl, r)
    routes = pack_for_verl(r.samples, DENSE_FIRST)
    with pytest.raises(EngineOutputError, match="multi-turn"):
        to_verl_nested(routes)
    assert torch.equal(to_verl_nested(routes, strict=False).values(), theirs.values())
    mask = verl.replay.build_r3_replay_mask(theirs, _response_mask(r)).values()
    offsets = theirs.offsets().tolist()
    assert mask[offsets[0] + 8 : offsets[0] + 11].all()  # replayed, though routeless


def _response_mask(r: Rollout) -> torch.Tensor:
    width = max(len(g) for g in r.responses)
    return torch.tensor([[1] * len(g) + [0] * (width - len(g)) for g in r.responses])


def test_equal_lengths_verl_stacks_dense(verl: SimpleNamespace) -> None:
    """``list_of_dict_to_tensordict`` stacks samples of one length into a dense ``[B, T, L, K]``
    tensor (which verl's R3 alignment refuses: it needs jagged input); rr stays jagged, with
    the same rows."""
    r = rollout("sglang", DENSE_FIRST, shapes=[(4, 3), (2, 5), (6, 1)])
    theirs = verl_jagged(verl, r)
    assert not theirs.is_nested
    assert tuple(theirs.shape) == (3, 7, 5, 4)
    ours = to_verl_nested(pack_for_verl(r.samples, DENSE_FIRST))
    assert ours.is_nested
    assert torch.equal(ours.values(), theirs.flatten(0, 1))
    with pytest.raises(TypeError, match="jagged"):
        verl.replay.align_r3_router_replay_data(theirs, ours)


def test_response_cut_equals_verl_agent_loop_cut(verl: SimpleNamespace) -> None:
    """verl's agent loops keep ``response_ids[:response_length]`` and
    ``routed_experts[:len(prompt) + response_length]``."""
    r = rollout("vllm_uint8", DENSE_FIRST)
    cut = 4
    rows = [e[: len(p) + cut] for e, p in zip(r.engine_rows, r.prompts, strict=True)]
    r.responses = [g[:cut] for g in r.responses]
    theirs = verl_jagged(verl, r, rows)
    ours = to_verl_nested(pack_for_verl(r.samples, DENSE_FIRST, response_length=cut))
    assert torch.equal(ours.offsets(), theirs.offsets())
    assert torch.equal(ours.values(), theirs.values())
