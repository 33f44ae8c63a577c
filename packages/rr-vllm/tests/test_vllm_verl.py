"""Compact routes for verl: every codec round-trips into verl's trainer layouts, bad routes raise
rr errors, and (where verl imports) the result equals verl 0.9.1's own conversion of the same
engine output, bit for bit: ``AgentLoopOutput.as_dict`` + ``list_of_dict_to_tensordict`` (the
jagged ``routed_experts`` field) and ``AgentLoopWorker._agent_loop_postprocess`` +
``_postprocess`` (the padded one) + ``left_right_2_no_padding``."""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import (
    CODECS,
    AlignmentError,
    CodecError,
    RouteBatch,
    RouteMeta,
    RouteValidationError,
    decode_routes,
)
from rr_core import bytes_per_token as codec_bytes_per_token
from rr_core.codecs import scatter
from rr_fakes.emulations.engines import (
    Faults,
    VllmEra,
    decode_sglang_routes,
    sglang_response,
    vllm_http_response,
    vllm_request_output,
)
from rr_fakes.shims.verl import agent_loop_batch, agent_loop_worker
from rr_vllm import (
    EngineOutputError,
    SampleRoutes,
    VerlRoutes,
    assemble_multi_turn,
    concat_verl_routes,
    decode_routes_array,
    decode_sglang,
    decode_vllm_batch,
    decode_vllm_http,
    decode_vllm_output,
    pack_batch_for_verl,
    pack_for_verl,
    to_verl_nested,
    to_verl_padded,
    unreplayable_rows,
)
from vllm_testing import distinct_routes, make_meta

#: (P, G) of the rollout's samples: different prompt and response lengths.
SHAPES = [(5, 4), (3, 1), (7, 6), (2, 8), (6, 3)]
PROMPT_LENGTH, RESPONSE_LENGTH = 8, 9
DENSE_FIRST = make_meta(num_experts=16, dense=(1,), layers=5, top_k=4)  # M * K = 16
ALL_MOE = make_meta(num_experts=12, layers=3, top_k=3)  # M * K = 9: the re-encoding concat
LAYOUTS = {"dense_first": DENSE_FIRST, "all_moe": ALL_MOE}
FORMATS = ("vllm_int32", "vllm_uint8", "vllm_http", "sglang")


@dataclasses.dataclass
class Rollout:
    """One engine format's answers for SHAPES, the rr samples decoded from them, and what verl's
    rollout servers hand its agent loop (``outputs[0].routed_experts``, or SGLang's int32
    array reshaped to ``[N, L, K]``)."""

    samples: list[SampleRoutes | None]
    engine_rows: list[np.ndarray]
    prompts: list[list[int]]
    responses: list[list[int]]
    raw: list[Any]


def rollout(fmt: str, meta: RouteMeta, shapes: list[tuple[int, int]] = SHAPES) -> Rollout:
    L, K = len(meta.layer_numbers), meta.top_k
    out = Rollout([], [], [], [], [])
    for i, (p, g) in enumerate(shapes):
        prompt, response = list(range(2, 2 + p)), list(range(2, 2 + g))
        ids = distinct_routes(meta, p + g - 1, seed=i)
        if fmt == "sglang":
            answer = sglang_response(prompt_ids=prompt, generated_ids=response, routes_TLK=ids)
            out.samples.append(decode_sglang(answer, meta))
            out.engine_rows.append(
                decode_sglang_routes(answer["meta_info"]["routed_experts"], L, K)
            )
        else:
            era = VllmEra.V0_14 if fmt == "vllm_int32" else VllmEra.V0_22
            answer = vllm_request_output(
                era,
                prompt_ids=prompt,
                generated_ids=response,
                routes_TLK=ids,
                num_experts=meta.num_experts,
                request_id=str(i),
                use_real_vllm=False,
            )
            if fmt == "vllm_http":
                out.samples += decode_vllm_http(vllm_http_response(answer), meta)
            else:
                out.samples += decode_vllm_output(answer, meta)
            out.engine_rows.append(answer.outputs[0].routed_experts)
        out.prompts.append(prompt)
        out.responses.append(response)
        out.raw.append(answer)
    return out


def expected_nested_values(r: Rollout) -> torch.Tensor:
    """Written out here: each sample's T rows, the engine's at the top, int16."""
    parts = []
    for rows, p, g in zip(r.engine_rows, r.prompts, r.responses, strict=True):
        t = np.zeros((len(p) + len(g), *rows.shape[1:]), dtype=np.int16)
        t[: rows.shape[0]] = rows
        parts.append(t)
    return torch.from_numpy(np.concatenate(parts))


def expected_padded(r: Rollout, prompt_length: int, response_length: int) -> torch.Tensor:
    _, L, K = r.engine_rows[0].shape
    out = torch.zeros((len(r.prompts), prompt_length + response_length, L, K), dtype=torch.int16)
    for b, (rows, p) in enumerate(zip(r.engine_rows, r.prompts, strict=True)):
        start = prompt_length - len(p)
        out[b, start : start + rows.shape[0]] = torch.from_numpy(rows.astype(np.int16))
    return out


def as_codec(values: torch.Tensor, codec: str) -> torch.Tensor:
    """What a codec gives back: ``set`` sorts each row's K ids."""
    return values.sort(dim=-1).values if codec == "set" else values


# -- (a) torch only ----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_into_both_layouts(fmt: str, layout: str, codec: str) -> None:
    meta = LAYOUTS[layout]
    r = rollout(fmt, meta)
    routes = pack_for_verl(r.samples, meta, codec=codec)
    assert routes.num_samples == len(SHAPES)
    assert routes.codec == codec
    assert routes.num_prompt_tokens == tuple(p for p, _ in SHAPES)
    assert routes.lengths == tuple(p + g for p, g in SHAPES)
    nested = to_verl_nested(routes)
    assert nested.is_nested
    assert nested.layout == torch.jagged
    assert nested.dtype == torch.int16
    assert nested.offsets().tolist() == [0, *itertools.accumulate(p + g for p, g in SHAPES)]
    assert torch.equal(nested.values(), as_codec(expected_nested_values(r), codec))
    padded = to_verl_padded(routes, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    assert padded.dtype == torch.int16
    assert torch.equal(padded, as_codec(expected_padded(r, PROMPT_LENGTH, RESPONSE_LENGTH), codec))


@pytest.mark.parametrize("codec", CODECS)
def test_batch_path_equals_sample_path(codec: str) -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    batch = decode_vllm_batch(r.raw, DENSE_FIRST)
    prompts = [len(p) for p in r.prompts]
    for validate in (True, False):
        got = pack_batch_for_verl(batch, prompts, codec=codec, validate=validate)
        want = pack_for_verl(r.samples, DENSE_FIRST, codec=codec)
        assert torch.equal(got.encoded.payload, want.encoded.payload)
        assert got.num_prompt_tokens == want.num_prompt_tokens


def test_bytes_per_token_on_qwen3_30b_a3b_shape() -> None:
    meta = make_meta(num_experts=128, layers=48, top_k=8)
    r = rollout("vllm_uint8", meta, shapes=[(40, 25), (17, 48)])
    figures = {c: pack_for_verl(r.samples, meta, codec=c) for c in CODECS}
    assert {c: codec_bytes_per_token(meta, c) for c in CODECS} == {
        "raw": 384.0,
        "packed": 336.0,
        "set": 246.0,
    }
    for codec, routes in figures.items():
        assert routes.verl_bytes_per_token == 768  # 48 layers x top-8 x int16
        tokens, valid = routes.num_tokens, routes.num_tokens - routes.num_samples  # T-1 rows
        payload = codec_bytes_per_token(meta, codec) * valid
        assert routes.bytes_per_token == pytest.approx((payload + -(-tokens // 8)) / tokens, 1e-3)
        assert routes.nbytes == routes.encoded.nbytes + 8 * routes.num_samples


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda a: a.__setitem__((2, 3, 1), 16), r"layer 4 .*outside \[0, 16\)"),
        (lambda a: a.__setitem__((2, 3, 1), a[2, 3, 0]), r"repeat an id; .*top_k=4 distinct"),
        (lambda a: a.__setitem__((2, 0, 0), 3), r"layer 1 \(slot 0, dense\).*must hold zeros"),
        (lambda a: a.__setitem__((slice(None), slice(1, None)), 0), r"all zero.*\(E1\)"),
        (lambda a: a.__setitem__((2, 3, 1), -1), r"do not fit torch.uint8"),
    ],
    ids=["out_of_range", "duplicate", "dense_slot", "zero_filled", "negative"],
)
def test_bad_ids_raise(mutate: Callable[[np.ndarray], None], match: str) -> None:
    ids = distinct_routes(DENSE_FIRST, 8, seed=1)
    mutate(ids)
    sample = decode_routes_array(ids, DENSE_FIRST, num_prompt_tokens=4, num_generated_tokens=5)
    with pytest.raises(RouteValidationError, match=match):
        pack_for_verl([sample], DENSE_FIRST)
    with pytest.raises(RouteValidationError, match=match):  # the same rows, unchecked
        pack_batch_for_verl(_unchecked_batch(sample), [4])


def _unchecked_batch(sample: SampleRoutes) -> RouteBatch:
    return RouteBatch.from_sequences(
        [torch.from_numpy(sample.routes_TLK)], DENSE_FIRST, valid=[sample.valid_T], validate=False
    )


def test_zero_filled_capture_from_the_engine_raises() -> None:
    ids = distinct_routes(DENSE_FIRST, 8)
    answer = vllm_request_output(
        VllmEra.V0_22,
        prompt_ids=[1] * 4,
        generated_ids=[2] * 5,
        routes_TLK=ids,
        num_experts=16,
        faults=Faults(all_zero=True),
        use_real_vllm=False,
    )
    with pytest.raises(RouteValidationError, match=r"zero-filled its routes \(E1\)"):
        pack_for_verl(decode_vllm_output(answer, DENSE_FIRST), DENSE_FIRST)


def test_wrong_layer_count_raises() -> None:
    ids = distinct_routes(make_meta(num_experts=16, layers=4, top_k=4), 8)
    with pytest.raises(EngineOutputError, match=r"expected \[rows, 5, 4\] \(all 5 decoder"):
        decode_routes_array(ids, DENSE_FIRST, num_prompt_tokens=4, num_generated_tokens=5)
    moe_axis = RouteMeta(num_experts=16, top_k=4, layer_axis="moe_layers", layer_numbers=(2, 3))
    with pytest.raises(RouteValidationError, match="all_layers axis"):
        pack_for_verl([], moe_axis)


def test_wrong_row_count_and_dropped_samples_raise() -> None:
    ids = distinct_routes(DENSE_FIRST, 6)
    with pytest.raises(AlignmentError):
        decode_routes_array(ids, DENSE_FIRST, num_prompt_tokens=4, num_generated_tokens=5)
    with pytest.raises(EngineOutputError, match="sample 0 is None"):
        pack_for_verl([None], DENSE_FIRST)
    with pytest.raises(CodecError, match="unknown codec"):
        pack_for_verl(rollout("vllm_uint8", DENSE_FIRST).samples, DENSE_FIRST, codec="zip")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_concat_equals_one_encoding(layout: str, codec: str) -> None:
    meta = LAYOUTS[layout]
    r = rollout("vllm_uint8", meta)
    whole = pack_for_verl(r.samples, meta, codec=codec)
    joined = concat_verl_routes([pack_for_verl([s], meta, codec=codec) for s in r.samples])
    assert joined.num_prompt_tokens == whole.num_prompt_tokens
    assert torch.equal(joined.encoded.offsets_B1, whole.encoded.offsets_B1)
    assert torch.equal(joined.encoded.valid_bits, whole.encoded.valid_bits)
    assert torch.equal(joined.encoded.payload, whole.encoded.payload)  # whichever path it took
    assert torch.equal(to_verl_nested(joined).values(), to_verl_nested(whole).values())


def test_concat_refuses_mixed_parts() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    a = pack_for_verl(r.samples[:1], DENSE_FIRST, codec="packed")
    with pytest.raises(CodecError, match="encode every part alike"):
        concat_verl_routes([a, pack_for_verl(r.samples[1:2], DENSE_FIRST, codec="set")])
    with pytest.raises(AlignmentError):
        concat_verl_routes([])
    assert concat_verl_routes([a]) is a


def test_response_length_cuts_as_verl_does() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    routes = pack_for_verl(r.samples, DENSE_FIRST, response_length=4)
    assert routes.lengths == tuple(p + min(g, 4) for p, g in SHAPES)
    nested = to_verl_nested(routes)
    for part, rows in zip(nested.unbind(), r.engine_rows, strict=True):
        n = min(rows.shape[0], part.shape[0])
        assert torch.equal(part[:n], torch.from_numpy(rows[:n].astype(np.int16)))
    with pytest.raises(AlignmentError, match="truncate the response"):
        to_verl_padded(pack_for_verl(r.samples, DENSE_FIRST), prompt_length=8, response_length=4)


def test_rows_verl_would_replay_without_a_route_raise() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    turn = r.samples[0]
    assert turn is not None
    tool = assemble_multi_turn(turn, num_tokens=turn.routes_TLK.shape[0] + 3, num_prompt_tokens=5)
    aborted = decode_routes_array(
        None, DENSE_FIRST, num_prompt_tokens=3, num_generated_tokens=2, finish_reason="abort"
    )
    routes = pack_for_verl([tool, r.samples[1], aborted], DENSE_FIRST)
    assert unreplayable_rows(routes) == [(0, [8, 9, 10]), (2, [0, 1, 2, 3])]
    for convert in (
        lambda **kw: to_verl_nested(routes, **kw),
        lambda **kw: to_verl_padded(routes, prompt_length=8, response_length=9, **kw),
    ):
        with pytest.raises(EngineOutputError, match=r"sample 0 .*rows \[8, 9, 10\].*strict=False"):
            convert()
        assert convert(strict=False).dtype == torch.int16
    assert unreplayable_rows(pack_for_verl(r.samples, DENSE_FIRST)) == []


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("max_blocks", [0, 1 << 14], ids=["by_mask", "by_slices"])
def test_expansion_equals_decode_routes(
    codec: str, max_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interleaved dense layers (several slot ranges), tool rows without a route: both ways of
    writing the ids into place give rr_core's decode, cast to int16."""
    monkeypatch.setattr(scatter, "MAX_BLOCKS", max_blocks)
    meta = make_meta(num_experts=16, dense=(1, 3), layers=6, top_k=4)
    r = rollout("vllm_uint8", meta)
    turn = r.samples[2]
    assert turn is not None
    r.samples[2] = assemble_multi_turn(turn, num_tokens=16, num_prompt_tokens=7)
    routes = pack_for_verl(r.samples, meta, codec=codec)
    nested = to_verl_nested(routes, strict=False)
    want = decode_routes(routes.encoded)
    assert torch.equal(nested.values(), want.values_NLK.to(torch.int16))
    assert torch.equal(nested.offsets(), want.offsets_B1)


def test_prompt_lengths_are_checked() -> None:
    routes = pack_for_verl(rollout("vllm_uint8", DENSE_FIRST).samples, DENSE_FIRST)
    with pytest.raises(AlignmentError, match="4 prompt lengths for 5 samples"):
        VerlRoutes(encoded=routes.encoded, num_prompt_tokens=routes.num_prompt_tokens[:4])
    with pytest.raises(AlignmentError, match=r"sample 1 has 4 tokens, so P=9"):
        VerlRoutes(encoded=routes.encoded, num_prompt_tokens=(5, 9, 7, 2, 6))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_only_the_payload_moves_to_the_device() -> None:
    r = rollout("vllm_uint8", DENSE_FIRST)
    routes = pack_for_verl(r.samples, DENSE_FIRST, codec="packed")
    nested = to_verl_nested(routes, device="cuda")
    assert nested.values().is_cuda
    assert nested.offsets().is_cuda
    assert torch.equal(nested.values().cpu(), expected_nested_values(r))
    padded = to_verl_padded(routes, prompt_length=8, response_length=9, device="cuda")
    assert torch.equal(padded.cpu(), expected_padded(r, 8, 9))


# -- (b) against verl's own conversion -----------------------------------------------------------


@pytest.fixture(scope="module")
def verl() -> SimpleNamespace:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron's fallbacks without apex / TE
            from rr_fakes.shims.megatron import megatron_cpu

            with megatron_cpu():
                from verl.experimental.agent_loop import agent_loop
                from verl.utils.megatron import router_replay_utils
                from verl.utils.tensordict_utils import list_of_dict_to_tensordict
                from verl.workers.utils.padding import left_right_2_no_padding
    except Exception as e:  # verl or one of its imports is missing
        pytest.skip(f"verl 0.9.1 is not importable here ({type(e).__name__}: {e})")
    return SimpleNamespace(
        agent_loop=agent_loop,
        list_of_dict_to_tensordict=list_of_dict_to_tensordict,
        left_right_2_no_padding=left_right_2_no_padding,
        replay=router_replay_utils,
    )


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
