"""rr's verl rollout side (``rr_vllm.verl.ADAPTER``, which ``rr_megatron_compat.verl.install()``
switches): verl 0.9.1's own agent-loop and padding code, unchanged, with rr's compact routes
between them. The engine's rows go in as verl's vLLM server hands them to its
agent loop; what comes out of ``left_right_2_no_padding`` is compared with verl's own path on the
same rows (bit for bit; ``set`` sorts each row's ids), and every fault verl lets through raises.
The model's geometry is read from real transformers configs, checked against the real models.

Skipped where verl cannot be imported (the ``verl`` nox session has it)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rr_vllm.verl as rollout
from rr_core import CODECS, AlignmentError, ReplayController, ReplayError, RouteValidationError
from rr_fakes.emulations.engines import VllmEra, vllm_request_output
from rr_fakes.pytest_support import settles
from rr_fakes.shims import verl as harness
from rr_fakes.sweeps import ANYTHING, SWEEP, arrays, tensors
from rr_vllm import EngineOutputError, VerlRoutes, moe_layer_numbers, route_meta_of
from verl_testing import verl_modules
from vllm_testing import distinct_routes

SHAPES = [(5, 4), (3, 1), (7, 6), (2, 8), (6, 3)]  # (P, G) of each sample
PROMPT_LENGTH, RESPONSE_LENGTH = 8, 9


@pytest.fixture(scope="module")
def verl() -> SimpleNamespace:
    modules = verl_modules()
    from transformers import Qwen3MoeConfig

    modules.config = Qwen3MoeConfig(  # 5 layers, the first dense; top-4 of 16
        num_hidden_layers=5, num_experts=16, num_experts_per_tok=4, mlp_only_layers=[0]
    )
    return modules


@contextmanager
def rr(codec: str = "packed") -> Iterator[None]:
    rollout.ADAPTER.install(codec=codec)
    try:
        yield
    finally:
        rollout.uninstall()


@pytest.fixture
def installed(verl: SimpleNamespace) -> Iterator[None]:
    with rr():
        yield


def engine_rows(
    verl: SimpleNamespace, shapes: list[tuple[int, int]], config: Any = None
) -> list[np.ndarray]:
    """What verl's vLLM server hands its agent loop: ``outputs[0].routed_experts`` (uint8)."""
    meta = route_meta_of(verl.config if config is None else config)
    return [
        vllm_request_output(
            VllmEra.V0_22,
            prompt_ids=list(range(2, 2 + p)),
            generated_ids=list(range(2, 2 + g)),
            routes_TLK=distinct_routes(meta, p + g - 1, seed=i),
            num_experts=meta.num_experts,
            use_real_vllm=False,
        )
        .outputs[0]
        .routed_experts
        for i, (p, g) in enumerate(shapes)
    ]


def outputs(
    verl: SimpleNamespace,
    shapes: list[tuple[int, int]],
    rows: list[Any] | None = None,
    masks: list[list[int]] | None = None,
    config: Any = None,
) -> list[Any]:
    al = verl.agent_loop
    rows = engine_rows(verl, shapes, config) if rows is None else rows
    return [
        al.AgentLoopOutput(
            prompt_ids=list(range(2, 2 + p)),
            response_ids=list(range(2, 2 + g)),
            response_mask=[1] * g if masks is None else masks[i],
            routed_experts=rows[i],
            metrics=al.AgentLoopMetrics(),
        )
        for i, (p, g) in enumerate(shapes)
    ]


def agent_loop_batch(
    verl: SimpleNamespace,
    samples: list[Any],
    config: Any = None,
    lengths: tuple[int, int] = (PROMPT_LENGTH, RESPONSE_LENGTH),
) -> Any:
    """verl's DataProto path: per sample ``_agent_loop_postprocess``, then ``_postprocess`` (what
    the agent-loop worker returns by Ray)."""
    worker = harness.agent_loop_worker(
        verl.config if config is None else config,
        prompt_length=lengths[0],
        response_length=lengths[1],
    )
    return harness.agent_loop_batch(worker, samples)


def trainer_batch(verl: SimpleNamespace, proto: Any) -> Any:
    """What verl's PPO trainer sends its engines: ``to_tensordict`` then
    ``left_right_2_no_padding``, as ``RayPPOTrainer._compute_old_log_prob`` does."""
    return verl.padding.left_right_2_no_padding(proto.to_tensordict())


def theirs_and_ours(
    verl: SimpleNamespace,
    shapes: list[tuple[int, int]],
    codec: str = "packed",
    lengths: tuple[int, int] = (PROMPT_LENGTH, RESPONSE_LENGTH),
    **kw: Any,
) -> tuple[Any, Any]:
    """The same engine rows through verl's path, then through it with rr installed."""
    config = kw.get("config")
    theirs = agent_loop_batch(verl, outputs(verl, shapes, **kw), config, lengths)
    with rr(codec):
        ours = agent_loop_batch(verl, outputs(verl, shapes, **kw), config, lengths)
    return theirs, ours


def as_codec(values: torch.Tensor, codec: str) -> torch.Tensor:
    return values.sort(dim=-1).values if codec == "set" else values


@pytest.mark.parametrize("codec", CODECS)
def test_trainer_tensor_equals_verls_own(verl: SimpleNamespace, codec: str) -> None:
    theirs, ours = theirs_and_ours(verl, SHAPES, codec)
    assert "routed_experts" in theirs.batch.keys()  # noqa: SIM118 (a TensorDict refuses `in`)
    assert "routed_experts" not in ours.batch.keys()  # noqa: SIM118 (stored compact, per sample)
    parts = ours.non_tensor_batch[rollout.FIELD]
    assert all(isinstance(p, VerlRoutes) and p.codec == codec for p in parts)
    mine = verl.padding.left_right_2_no_padding
    with rr(codec):
        assert verl.padding.left_right_2_no_padding is not mine
        a = trainer_batch(verl, theirs)["routed_experts"]
        b = trainer_batch(verl, ours)
    assert rollout.FIELD not in b.keys()  # noqa: SIM118 (the engines get verl's tensor alone)
    b = b["routed_experts"]
    assert b.is_nested
    assert b.dtype == a.dtype == torch.int16
    assert torch.equal(b.offsets(), a.offsets().to(torch.int64))
    assert torch.equal(b.values(), as_codec(a.values(), codec))


def test_verls_reorder_and_split_carry_the_routes(verl: SimpleNamespace) -> None:
    """verl balances the batch across ranks (``reorder``) and splits it (``chunk``): the
    per-sample routes move with their samples."""
    theirs, ours = theirs_and_ours(verl, SHAPES)
    order = torch.tensor([3, 0, 4, 2, 1])
    for proto in (theirs, ours):
        proto.reorder(order)
    for a, b in zip(theirs.chunk(5)[1:3], ours.chunk(5)[1:3], strict=True):
        with rr():
            want, got = trainer_batch(verl, a), trainer_batch(verl, b)
        assert torch.equal(got["routed_experts"].values(), want["routed_experts"].values())


@pytest.mark.parametrize(("codec", "share"), [("raw", 0.55), ("packed", 0.35), ("set", 0.25)])
def test_fewer_bytes_from_the_agent_loop_to_the_trainer(
    verl: SimpleNamespace, codec: str, share: float
) -> None:
    """The batch an agent-loop worker returns by Ray, pickled, on a Qwen3-30B-A3B geometry (48
    layers, top-8 of 128): verl's padded int16 tensor against one compact payload per sample,
    which holds only the rows of real tokens (raw: uint8 ids; packed: 7 bits; set: a bitmap
    per row)."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(num_hidden_layers=48, num_experts=128, num_experts_per_tok=8)
    shapes = [(40, 100), (64, 20), (10, 128), (33, 77)]
    theirs, ours = theirs_and_ours(verl, shapes, codec, lengths=(64, 128), config=config)
    routes = theirs.batch["routed_experts"]
    routes_bytes = len(pickle.dumps(ours)) - len(pickle.dumps(theirs)) + routes.nbytes
    assert routes_bytes < share * routes.nbytes


def test_multi_turn_tail_without_trained_tokens_is_verls_tensor(verl: SimpleNamespace) -> None:
    """A trajectory ending in tool output: the last generation's rows stop before it. No trained
    token depends on those rows, so rr accepts them, as zeros, like verl."""
    shapes = [(5, 7), (3, 2)]
    rows = engine_rows(verl, shapes)
    rows[0] = rows[0][:8]  # rows of tokens 0..7; tokens 8..11 are tool output
    masks = [[1, 1, 1, 0, 0, 0, 0], [1, 1]]
    theirs, ours = theirs_and_ours(verl, shapes, rows=rows, masks=masks)
    with rr():
        got = trainer_batch(verl, ours)["routed_experts"]
    assert torch.equal(got.values(), trainer_batch(verl, theirs)["routed_experts"].values())


def test_trained_token_after_missing_rows_raises(verl: SimpleNamespace, installed: None) -> None:
    shapes = [(5, 7)]
    rows = engine_rows(verl, shapes)
    rows[0] = rows[0][:8]
    with pytest.raises(EngineOutputError, match=r"token 9 .*trained"):
        agent_loop_batch(verl, outputs(verl, shapes, rows=rows, masks=[[1, 1, 1, 0, 1, 0, 0]]))


def test_cut_response_keeps_the_last_row(verl: SimpleNamespace) -> None:
    """verl's agent loops cut the routes to ``P + response_length`` rows with the response:
    every kept token has a row then."""
    shapes = [(5, 4)]
    rows = [r[:9] for r in engine_rows(verl, [(5, 6)])]  # engine went 2 tokens further
    theirs, ours = theirs_and_ours(verl, shapes, rows=rows)
    (part,) = ours.non_tensor_batch[rollout.FIELD]
    assert part.lengths == (9,)
    with rr():
        got = trainer_batch(verl, ours)["routed_experts"].values()
    assert torch.equal(got, trainer_batch(verl, theirs)["routed_experts"].values())


def _bad_ids(rows: list[np.ndarray]) -> None:
    rows[1] = rows[1].copy()
    rows[1][2, 3, 0] = 16  # expert 16 of 16


def _duplicate(rows: list[np.ndarray]) -> None:
    rows[1] = rows[1].copy()
    rows[1][1, 2, 1] = rows[1][1, 2, 0]


def _dense_nonzero(rows: list[np.ndarray]) -> None:
    rows[0] = rows[0].copy()
    rows[0][0, 0, 0] = 3  # layer 1 is dense


def _other_model(rows: list[np.ndarray]) -> None:
    rows[2] = rows[2][:, :4]  # 4 layers, not 5


def _too_many_rows(rows: list[np.ndarray]) -> None:
    rows[0] = np.concatenate([rows[0], rows[0][:2]])  # 10 rows for 9 tokens


def _all_zero(rows: list[np.ndarray]) -> None:
    rows[3] = rows[3].copy()
    rows[3][:, 2] = 0  # a capture that never wrote layer 3 (E1)


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        (_bad_ids, RouteValidationError, "16"),
        (_duplicate, RouteValidationError, "repeat|distinct|duplicate"),
        (_dense_nonzero, RouteValidationError, "dense"),
        (_other_model, EngineOutputError, "another model"),
        (_too_many_rows, AlignmentError, "more rows than tokens"),
        (_all_zero, RouteValidationError, "zero"),
    ],
    ids=lambda v: v.__name__ if callable(v) and v.__name__.startswith("_") else "",
)
def test_faults_verl_lets_through_raise(
    verl: SimpleNamespace, installed: None, fault: Any, error: type[Exception], match: str
) -> None:
    rows = engine_rows(verl, SHAPES)
    fault(rows)
    with pytest.raises(error, match=match):
        agent_loop_batch(verl, outputs(verl, SHAPES, rows=rows))


def test_sample_without_routes_raises_where_it_is_trained(
    verl: SimpleNamespace, installed: None
) -> None:
    """verl keeps the routes of a batch only if its first sample has them (``_postprocess``
    reads ``inputs[0]``) and fails on a later one without; rr names the sample, and accepts one
    that trains nothing."""
    rows: list[Any] = engine_rows(verl, SHAPES)
    rows[2] = None  # an aborted request
    proto = agent_loop_batch(verl, outputs(verl, SHAPES, rows=rows))
    with pytest.raises(EngineOutputError, match=r"sample 2 .*no routes"):
        trainer_batch(verl, proto)
    masks = [[1] * g for _, g in SHAPES]
    masks[2] = [0] * SHAPES[2][1]
    proto = agent_loop_batch(verl, outputs(verl, SHAPES, rows=rows, masks=masks))
    values = trainer_batch(verl, proto)["routed_experts"].unbind()
    assert not values[2].any()
    assert values[1].any()


def test_r2_routes_beside_rollout_routes_raise(verl: SimpleNamespace, installed: None) -> None:
    """verl refuses R2 and R3 at once by finding both in the batch; its R3 field is rr's now,
    so rr refuses in its place."""
    proto = agent_loop_batch(verl, outputs(verl, SHAPES))
    data = proto.to_tensordict()
    data["routed_experts"] = torch.zeros(len(SHAPES), PROMPT_LENGTH + RESPONSE_LENGTH, 5, 4)
    with pytest.raises(ReplayError, match="R2"):
        verl.padding.left_right_2_no_padding(data)


# -- the model's geometry, from real configs and models -------------------------------------------


@pytest.fixture(scope="module")
def transformers_models() -> Any:
    try:
        import rr_transformers
        from rr_fakes.shims.hf_models import tiny_model
    except ImportError as e:
        pytest.skip(f"needs transformers and rr-transformers ({e})")
    return rr_transformers, tiny_model


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("qwen3_moe", {}),
        ("qwen3_moe", {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": []}),
        ("qwen2_moe", {}),
        ("qwen3_next", {}),
        ("olmoe", {}),
        ("mixtral", {}),
        ("gpt_oss", {}),
        ("deepseek_v3", {}),
        ("deepseek_v3", {"num_hidden_layers": 4, "first_k_dense_replace": 2}),
        ("glm4_moe", {}),
    ],
)
def test_moe_layers_of_a_config_are_the_models_routers(
    transformers_models: Any, family: str, overrides: dict[str, Any]
) -> None:
    rr_transformers, tiny_model = transformers_models
    model = tiny_model(family, **overrides)
    controller = ReplayController(num_experts=8, top_k=2)
    rr_transformers.install()
    try:
        found = rr_transformers.attach(controller, model).layer_numbers
        rr_transformers.detach(controller)
    finally:
        rr_transformers.uninstall()
    assert moe_layer_numbers(model.config) == found
    assert moe_layer_numbers(model.config.to_dict()) == found  # a config.json as a dict
    meta = route_meta_of(model.config)
    assert meta.layer_numbers == tuple(range(1, model.config.num_hidden_layers + 1))
    assert meta.routed_layer_numbers == found


def test_readme_verl_example_runs(
    verl: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = Path(__file__).parents[1] / "README.md"
    (block,) = re.findall(r"```python verl\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    exec(compile(block, str(readme), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == "True\n"


# -- bad input: an rr error, never a raw exception -------------------------------------------------


def _agent_output(draw: st.DrawFn) -> Any:
    """An agent-loop output of plausible and implausible fields (duck-typed, as verl's is read)."""
    p, g = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    return SimpleNamespace(
        prompt_ids=draw(st.one_of(st.just(list(range(p))), ANYTHING)),
        response_ids=draw(st.one_of(st.just(list(range(g))), ANYTHING)),
        response_mask=draw(st.one_of(st.just([1] * g), ANYTHING)),
        routed_experts=draw(st.one_of(arrays(), ANYTHING)),
    )


META_5 = route_meta_of(
    {"num_hidden_layers": 5, "num_experts": 16, "num_experts_per_tok": 4, "mlp_only_layers": [0]}
)


@SWEEP
@given(
    output=st.one_of(st.builds(SimpleNamespace), ANYTHING, st.composite(_agent_output)()),
    meta=st.one_of(st.just(META_5), ANYTHING),
    codec=st.one_of(st.sampled_from(CODECS), ANYTHING),
)
def test_compact_sample_refuses_junk(output: Any, meta: Any, codec: Any) -> None:
    ok, routes = settles(rollout.compact_sample, output, meta, codec=codec)
    if ok:
        assert isinstance(routes, VerlRoutes)
        assert routes.num_samples == 1


@SWEEP
@given(
    parts=st.one_of(st.lists(st.one_of(st.none(), ANYTHING), max_size=3), ANYTHING),
    offsets=st.one_of(tensors(), ANYTHING),
    trained=st.one_of(tensors(), ANYTHING),
    device=st.one_of(st.none(), ANYTHING),
)
def test_expand_samples_refuses_junk(parts: Any, offsets: Any, trained: Any, device: Any) -> None:
    ok, routes = settles(rollout.expand_samples, parts, offsets, trained, device=device)
    if ok and routes is not None:
        assert routes.is_nested
