"""Which test files each nox session runs, as absolute paths: every test file runs in exactly one
session (tests/test_noxfile.py holds every session to that), so a folder one session runs is left
out, by name, of each other session that collects its parent."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ROOT / "packages"
_FAKES, _COMPAT = PACKAGES / "rr-fakes" / "tests", PACKAGES / "rr-megatron-compat" / "tests"
_VLLM, _TRANSFORMERS = PACKAGES / "rr-vllm" / "tests", PACKAGES / "rr-transformers" / "tests"
_DEMO = PACKAGES / "rr-demo" / "tests"


def selection(tests: list[Path], *leave_out: Path) -> list[str]:
    """pytest arguments that collect ``tests`` except what lies under ``leave_out``."""
    return [*map(str, tests), *(f"--ignore={path}" for path in leave_out)]


#: Torch-only tests (the core session): everything under these folders no other session runs.
CORE_TESTS = [
    ROOT / "tests",
    *(PACKAGES / name / "tests" for name in ("rr-core", "rr-fakes", "rr-npu")),
]
#: rr-vllm's tests (the vllm session): every one, on the real classes where they import.
VLLM_TESTS = [_VLLM]

#: The real-engine tests (the engine session) and the verl-job harness's own tests beside them
#: (the job itself is the verl_job session: two jobs take 7-10 minutes here).
ENGINE_TESTS = _VLLM / "engine"
DEMO_ENGINE_TEST = _DEMO / "test_demo_engine.py"
VERL_JOB_TESTS = _FAKES / "verl_job"

#: The tests of TRL's own loop (not named "trl": pytest would import the folder as TRL itself,
#: and verl would then see a TRL), and ``rr demo --loop``: two GRPO steps without and with rr.
TRL_TESTS = _TRANSFORMERS / "grpo_trl"
DEMO_LOOP_TEST = _DEMO / "test_demo_loop.py"

#: rr-vllm's SGLang tests: the emulated answers of every era, and the real wheels' classes.
SGLANG_TESTS = [_VLLM / f"test_vllm_sglang{s}.py" for s in ("", "_real")]

#: The megatron sessions' tests (per line); the demo's chain runs on the oldest and newest line.
DEMO_TESTS = _DEMO
MEGATRON_TESTS = [_FAKES / "megatron_harness", _COMPAT, DEMO_TESTS]
#: The CPU harness's multi-process launcher (PP, EP, a hung or failing rank) and the demo's
#: end-to-end chain run on the lines the multi-rank replay tests run on (each part they use is
#: tested on every line): about a minute of each middle line.
HARNESS_LAUNCH_TESTS = _FAKES / "megatron_harness" / "test_harness_dist.py"
DISTRIBUTED_TESTS = _COMPAT / "distributed"
VERL_DISTRIBUTED_TEST = DISTRIBUTED_TESTS / "test_verl_dist.py"  # run by the verl session

#: The tests that depend on the megatron-core line under the emulated Ascend stack (the torch-only
#: rr-npu tests run once, in core).
NPU_TESTS = [
    PACKAGES / "rr-npu" / "tests" / "test_npu_mindspeed.py",
    PACKAGES / "rr-npu" / "tests" / "test_npu_readme.py",
    PACKAGES / "rr-npu" / "tests" / "test_npu_protocol.py",  # the adapter protocol on Megatron
    _FAKES / "mindspeed",  # the emulated MindSpeed on the installed line
]

#: Tests that need the real verl package (they skip elsewhere).
VERL_TESTS = [
    _FAKES / "verl_harness",
    _COMPAT / "test_compat_verl_install.py",
    _COMPAT / "test_compat_verl_engine.py",
    _COMPAT / "test_compat_verl_switch.py",  # the one switch
    _VLLM / "test_vllm_verl.py",
    _VLLM / "test_vllm_verl_versus.py",  # verl's own conversion of the same answers
    _VLLM / "test_vllm_verl_rollout.py",  # verl's agent loop under rr
    _VLLM / "test_vllm_verl_arrival.py",  # routes expanded in workers
    _VLLM / "test_vllm_verl_install.py",  # into verl's Ray processes
    _TRANSFORMERS / "verl",  # verl's FSDP engine over transformers
    ROOT / "tests" / "test_adapter_protocol.py",  # every framework at once: verl's venv has them
]

#: Real Megatron-Bridge models (they skip without megatron.bridge).
BRIDGE_TESTS = _COMPAT / "bridge"

#: Real transformers models (each pinned release in turn), the transformers demo, and the
#: FSDP2 tests on two gloo processes.
TRANSFORMERS_DEMO_TEST = _DEMO / "test_demo_transformers.py"
TRANSFORMERS_TESTS = [_TRANSFORMERS, TRANSFORMERS_DEMO_TEST]
TRANSFORMERS_DISTRIBUTED_TESTS = _TRANSFORMERS / "distributed"

#: What each session collects with ``selection``, the folders of other sessions left out.
CORE = selection(CORE_TESTS, *MEGATRON_TESTS, *VERL_TESTS, *NPU_TESTS, VERL_JOB_TESTS)
VLLM = selection(VLLM_TESTS, *VERL_TESTS, *SGLANG_TESTS, ENGINE_TESTS)
TRANSFORMERS = selection(TRANSFORMERS_TESTS, TRANSFORMERS_DISTRIBUTED_TESTS, TRL_TESTS, *VERL_TESTS)
COMPAT = selection([_COMPAT], DISTRIBUTED_TESTS, BRIDGE_TESTS, *VERL_TESTS)
DISTRIBUTED = selection([DISTRIBUTED_TESTS], VERL_DISTRIBUTED_TEST)
#: The megatron session's leave-outs on every line.
MEGATRON_LEAVE_OUT = (
    DISTRIBUTED_TESTS, *VERL_TESTS, TRANSFORMERS_DEMO_TEST, DEMO_ENGINE_TEST, BRIDGE_TESTS,
    DEMO_LOOP_TEST,
)  # fmt: skip
