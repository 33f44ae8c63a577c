"""verl 0.9.1's own Megatron engine (``forward_backward_batch`` -> its ``forward_step``) on tiny
real GPTModels, with verl's own router replay: disabled, R2 record then replay under perturbed
router weights, and R3 with rollout routes one row short per sequence. Routing is read back
from forward hooks on every decoder router, in the forward and in the backward recompute."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from rr_fakes.shims.megatron import ParallelSizes, launch, model_parallel
from rr_fakes.shims.verl import (
    BATCHINGS,
    LENGTHS,
    PROMPTS,
    RESPONSES,
    build_verl_chunks,
    grads_ok,
    moe_column,
    packed,
    perturb,
    pipeline_r2_rank,
    rollout_routes,
    route_log,
    routed_as,
    routers,
    run_step,
    tiny_config,
    verl_batch,
    verl_cpu,
    verl_engine,
)

config = tiny_config


# -- (a) replay disabled -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "recompute"), [("one", False), ("per_sequence", True), ("dynamic", True)]
)
def test_disabled_runs_verls_forward_backward_with_finite_logprobs_and_grads(
    kind: str, recompute: bool
) -> None:
    with verl_cpu(), model_parallel():
        cfg = config(recompute=recompute, freq=[0, 1, 1, 1])
        chunks = build_verl_chunks(cfg, mode="disabled")
        engine = verl_engine(chunks, mode="disabled")
        data = verl_batch(PROMPTS, RESPONSES, cfg.vocab_size, **BATCHINGS[kind])
        out = run_step(engine, data, forward_only=False)
        log_probs = out["model_output"]["log_probs"]
        assert log_probs.offsets().diff().tolist() == list(LENGTHS)
        assert torch.isfinite(log_probs.values()).all()
        assert (log_probs.values() <= 0).all()
        assert len(out["loss"]) == {"one": 1, "per_sequence": 4, "dynamic": len(out["loss"])}[kind]
        assert grads_ok(chunks)


def test_temperature_divides_the_logits_in_place() -> None:
    """verl's ``logits.div_(temperature)`` runs: a different temperature, other log-probs."""
    with verl_cpu(), model_parallel():
        cfg = config()
        engine = verl_engine(build_verl_chunks(cfg, mode="disabled"), mode="disabled")
        hot, cold = (
            run_step(
                engine,
                verl_batch(PROMPTS, RESPONSES, cfg.vocab_size, micro_batch_size=4, temperature=t),
                forward_only=True,
            )["model_output"]["log_probs"].values()
            for t in (1.0, 0.5)
        )
        assert not torch.allclose(hot, cold)


# -- (b) R2: record, then replay under perturbed router weights ----------------------------------
@pytest.mark.parametrize(
    ("kind", "recompute", "freq"),
    [
        ("one", False, 1),
        ("one", True, [0, 1, 1, 1]),
        ("per_sequence", True, [0, 1, 1, 1]),
        ("dynamic", True, 1),
    ],
)
def test_R2_record_then_replay_is_exact(kind: str, recompute: bool, freq: Any) -> None:
    with verl_cpu(), model_parallel():
        cfg = config(recompute=recompute, freq=freq)
        chunks = build_verl_chunks(cfg, mode="R2")
        engine = verl_engine(chunks, mode="R2")
        tf = engine.tf_config
        layers = [r.layer_number for r in routers(chunks)]

        def batch(**kw: Any) -> Any:
            return verl_batch(PROMPTS, RESPONSES, cfg.vocab_size, **BATCHINGS[kind], **kw)

        with route_log(chunks) as native:
            record = run_step(engine, batch(enable_routing_replay=True), forward_only=True)
        routes = record["model_output"]["routed_experts"]
        assert routes.dtype == torch.int16
        assert routes.shape[0] == len(PROMPTS)
        assert routes.shape[-2:] == (len(layers), cfg.top_k)
        assert routes.offsets().diff().tolist() == list(LENGTHS)
        if kind != "dynamic":  # dynamic batching reorders the packed rows
            for layer in layers:
                assert routed_as(native, routes, tf, layer, recompute=False), f"layer {layer}"

        perturb(chunks)
        with route_log(chunks) as moved:
            run_step(engine, batch(), forward_only=True)  # replay off: native routing
        if kind != "dynamic":
            changed = sum(
                (moved.rows(layer, recompute=False).sort(-1).values != packed(routes, i))
                .any(-1)
                .float()
                .mean()
                for i, layer in enumerate(layers)
            )
            assert changed > 0.05, "the perturbation must move native routes for this to test"

        with route_log(chunks) as replay:
            out = run_step(
                engine, batch(routed_experts=routes, enable_routing_replay=True), forward_only=False
            )
        assert torch.isfinite(out["model_output"]["log_probs"].values()).all()
        assert grads_ok(chunks)
        passes = [False, True] if recompute else [False]
        for layer in layers:
            for rec in passes:
                assert routed_as(
                    replay, routes, tf, layer, recompute=rec, reordered=kind == "dynamic"
                ), f"layer {layer} recompute={rec}"


def test_R2_one_and_several_microbatches_agree_under_recompute() -> None:
    """The same replayed step split into 1 or 4 micro-batches: identical log-probs on every row
    verl reads, and identical router gradients."""
    results = []
    for kind in ("one", "per_sequence"):
        with verl_cpu(), model_parallel():
            cfg = config(recompute=True, freq=[0, 1, 1, 1])
            chunks = build_verl_chunks(cfg, mode="R2")
            engine = verl_engine(chunks, mode="R2")
            batch = {
                "prompt_lens": PROMPTS,
                "response_lens": RESPONSES,
                "vocab_size": cfg.vocab_size,
            }
            routes = run_step(
                engine,
                verl_batch(**batch, **BATCHINGS[kind], enable_routing_replay=True),
                forward_only=True,
            )["model_output"]["routed_experts"]
            perturb(chunks)
            out = run_step(
                engine,
                verl_batch(
                    **batch, **BATCHINGS[kind], routed_experts=routes, enable_routing_replay=True
                ),
                forward_only=False,
            )
            grads = torch.cat([r.weight.grad.flatten() for r in routers(chunks)])
            results.append((out["model_output"]["log_probs"].values(), grads))
    (lp1, g1), (lp4, g4) = results
    ends = torch.tensor(list(LENGTHS)).cumsum(0) - 1
    used = torch.ones(lp1.shape[0], dtype=torch.bool)
    used[ends] = False
    torch.testing.assert_close(lp1[used], lp4[used], rtol=1e-5, atol=1e-5)
    # verl rolls the labels over the whole packed micro-batch, so a sequence's last row scores
    # the next packed sequence's first token: it depends on the micro-batching (and is unused).
    assert not torch.allclose(lp1[ends], lp4[ends])
    torch.testing.assert_close(g1, g4, rtol=1e-4, atol=1e-6)


# -- (c) R3: rollout routes one row short per sequence -------------------------------------------
@pytest.mark.parametrize(
    ("kind", "recompute", "freq", "all_layers"),
    [
        ("one", False, 1, True),
        ("per_sequence", True, [0, 1, 1, 1], True),
        ("one", True, [0, 1, 1, 1], False),
    ],
)
def test_R3_replays_rollout_routes_on_every_row_but_the_last(
    kind: str, recompute: bool, freq: Any, all_layers: bool
) -> None:
    with verl_cpu(), model_parallel():
        cfg = config(recompute=recompute, freq=freq)
        chunks = build_verl_chunks(cfg, mode="R3")
        engine = verl_engine(chunks, mode="R3")
        layers = [r.layer_number for r in routers(chunks)]
        columns = cfg.num_layers if all_layers else len(layers)
        lengths = list(LENGTHS)
        routes = rollout_routes(lengths, columns, cfg)
        data = verl_batch(
            PROMPTS,
            RESPONSES,
            cfg.vocab_size,
            **BATCHINGS[kind],
            routed_experts=routes,
            enable_routing_replay=True,
        )
        with route_log(chunks) as log:
            out = run_step(engine, data, forward_only=False)
        assert torch.isfinite(out["model_output"]["log_probs"].values()).all()
        assert grads_ok(chunks)
        ends = torch.tensor(lengths).cumsum(0)
        keep = torch.ones(int(ends[-1]), dtype=torch.bool)
        keep[ends - 1] = False  # the last row of each sequence routes natively
        for layer in layers:
            column = moe_column(engine.tf_config, layer, columns)
            target = torch.cat([r[:, column, :].long() for r in routes]).sort(-1).values
            for rec in [False, True] if recompute else [False]:
                used = log.rows(layer, recompute=rec).sort(-1).values
                assert torch.equal(used[keep], target), f"layer {layer} recompute={rec}"


def test_replay_mode_needs_chunks_built_under_verls_patch() -> None:
    with verl_cpu(), model_parallel():
        chunks = build_verl_chunks(config(), mode="disabled")
        with pytest.raises(ValueError, match="hold no verl RouterReplay"):
            verl_engine(chunks, mode="R2")


# -- PP=2 and PP=2 x VPP=2 on two gloo processes --------------------------------------------------
@pytest.mark.parametrize("recompute", [False, True])
def test_R2_pp2_1f1b_records_every_stage_and_replays_exactly(recompute: bool) -> None:
    results = launch(pipeline_r2_rank, 2, 4, recompute, sizes=ParallelSizes(pp=2), timeout_s=240)
    assert results == [(0, [1, 2], True, True, 4), (1, [3, 4], True, True, 4)]


def test_R2_pp2_vpp2_interleaved_records_and_replays_exactly_with_recompute() -> None:
    results = launch(pipeline_r2_rank, 2, 8, True, sizes=ParallelSizes(pp=2, vpp=2), timeout_s=240)
    assert results == [(0, [1, 2, 5, 6], True, True, 8), (1, [3, 4, 7, 8], True, True, 8)]


def test_readme_example_runs() -> None:
    """The README's verl example (fenced ``py``, so the torch-only and Megatron README tests,
    which run ``python`` blocks on installs without verl, leave it to this one)."""
    readme = Path(__file__).parents[2] / "README.md"
    blocks = re.findall(r"```py\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    blocks = [b for b in blocks if "rr_fakes.shims.verl" in b]
    assert blocks, "the README has no verl example"
    for block in blocks:
        exec(compile(block, str(readme), "exec"), {"__name__": "readme"})
