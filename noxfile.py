"""Every check of the rr monorepo. `nox` runs the default sessions; `nox -l` lists them all.

Each session installs the local CPU build of torch first and constrains every later install to
it, so no dependency can pull a multi-GB CUDA build.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "core", "vllm", "megatron", "distributed"]

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"
TORCH = "torch==2.13.0"
ALL_PACKAGES = ("rr-core", "rr-megatron-compat", "rr-npu", "rr-vllm", "rr-fakes")
# xdist by default; a fixed hypothesis seed so a gate run is reproducible (run pytest directly,
# or pass posargs, to explore new examples).
PYTEST_DEFAULTS = ["-n", "auto", "-q", "--hypothesis-seed=0"]

# The megatron-core matrix is plain data in rr_fakes (read by path: no torch import here).
MEGATRON_LINES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = runpy.run_path(
    str(PACKAGES / "rr-fakes" / "src" / "rr_fakes" / "megatron" / "_lines.py")
)["MEGATRON_LINES"]
MEGATRON_TESTS = [
    PACKAGES / "rr-fakes" / "tests" / "megatron_harness",
    PACKAGES / "rr-megatron-compat" / "tests",
]
# The vLLM release the real-class tests use, and what lets it import on CPU torch.
VLLM_DATA = runpy.run_path(str(PACKAGES / "rr-vllm" / "src" / "rr_vllm" / "_supported.py"))


def install_with_torch(session: nox.Session, *args: str) -> None:
    """Install torch==2.13.0 first, then ``args`` constrained to that torch."""
    constraints = Path(session.create_tmp()) / "torch-constraint.txt"
    constraints.write_text(f"{TORCH}\n")
    session.install(TORCH)
    session.install("-c", str(constraints), *args)


def editable(*names: str) -> list[str]:
    """``-e packages/<name>`` arguments for pip."""
    return [arg for name in names for arg in ("-e", str(PACKAGES / name))]


def report_versions(session: nox.Session) -> None:
    """Print what the session actually installed (rr doctor reads package metadata only)."""
    session.run("rr", "doctor", success_codes=[0, 1])


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and format, mypy (strict on rr_core), import-linter layer contracts."""
    install_with_torch(session, "ruff", "mypy", "import-linter", *editable(*ALL_PACKAGES))
    report_versions(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(PACKAGES / name / "src") for name in ALL_PACKAGES]
    session.run("mypy", *sources)
    session.run("lint-imports")


@nox.session(python="3.11")
def core(session: nox.Session) -> None:
    """rr-core, rr-fakes and rr-vllm tests (pytest-xdist), torch only: no megatron, no vllm."""
    install_with_torch(session, *editable("rr-core[test]", "rr-fakes", "rr-vllm"))
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    tests = [str(PACKAGES / name / "tests") for name in ("rr-core", "rr-fakes", "rr-vllm")]
    session.run("pytest", *tests, *args)


@nox.session(python="3.11")
def vllm(session: nox.Session) -> None:
    """rr-vllm against the real vLLM output, sampling and engine-argument classes (CPU import)."""
    install_with_torch(session, "numpy")
    install_with_torch(session, "--no-deps", f"vllm=={VLLM_DATA['TESTED_VLLM']}")
    install_with_torch(session, *VLLM_DATA["VLLM_IMPORT_DEPS"])
    install_with_torch(session, *editable("rr-core[test]", "rr-fakes", "rr-vllm"))
    report_versions(session)
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", str(PACKAGES / "rr-vllm" / "tests"), *args)


@nox.session(python="3.11", default=False)
def doctor(session: nox.Session) -> None:
    """Install every rr package and run `rr doctor` (what is installed, what is supported)."""
    install_with_torch(session, *editable(*ALL_PACKAGES))
    session.run("rr", "doctor", *session.posargs)


@nox.session(python="3.11", default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks of rr-core and rr-vllm, each in its own process, figures side by side."""
    install_with_torch(session, *editable("rr-core", "rr-fakes", "rr-vllm"))
    report_versions(session)
    for script in ("rr-core/benchmarks/bench_core.py", "rr-core/benchmarks/bench_codecs.py"):
        session.run("python", str(PACKAGES / script), *session.posargs)
    session.run("python", str(PACKAGES / "rr-vllm/benchmarks/bench_vllm.py"), *session.posargs)


@nox.session(python="3.11")
@nox.parametrize("line", list(MEGATRON_LINES), ids=list(MEGATRON_LINES))
def megatron(session: nox.Session, line: str) -> None:
    """Real megatron-core on CPU, one pinned release per line: harness and compat tests."""
    release, flags, extras = MEGATRON_LINES[line]
    install_with_torch(
        session, *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat", "rr-vllm")
    )
    install_with_torch(session, *flags, f"megatron-core=={release}", *extras)
    report_versions(session)
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m; "
        "print(*(f'{d}=={m.version(d)}' for d in ('torch', 'megatron-core')))",
    )
    args = session.posargs or PYTEST_DEFAULTS
    session.run("pytest", *map(str, MEGATRON_TESTS), *args)


DISTRIBUTED_LINES = (next(iter(MEGATRON_LINES)), list(MEGATRON_LINES)[-1])  # oldest, newest


@nox.session(python="3.11")
@nox.parametrize("line", list(DISTRIBUTED_LINES), ids=list(DISTRIBUTED_LINES))
def distributed(session: nox.Session, line: str) -> None:
    """Two-process gloo replay: PP=2 1F1B R3 across stages, EP=2 alltoall with duplicate ids,
    PP=2 x VPP=2 interleaved with activation recompute (oldest and newest line)."""
    release, flags, extras = MEGATRON_LINES[line]
    install_with_torch(session, *editable("rr-core[test]", "rr-fakes", "rr-megatron-compat"))
    install_with_torch(session, *flags, f"megatron-core=={release}", *extras)
    report_versions(session)
    args = session.posargs or ["-q", "-p", "no:xdist"]  # each test already runs two ranks
    session.run(
        "pytest",
        str(PACKAGES / "rr-megatron-compat" / "tests" / "distributed"),
        *args,
        env={"RR_DISTRIBUTED": "1"},
    )


@nox.session(python="3.11", default=False)
def demo(session: nox.Session) -> None:
    """The main job on CPU: roll out, capture as vLLM returns it, replay in real Megatron."""
    release, flags, extras = MEGATRON_LINES[list(MEGATRON_LINES)[-1]]  # the newest line
    install_with_torch(session, *flags, f"megatron-core=={release}", *extras)
    install_with_torch(session, "--no-deps", f"vllm=={VLLM_DATA['TESTED_VLLM']}")
    install_with_torch(session, *VLLM_DATA["VLLM_IMPORT_DEPS"])
    install_with_torch(
        session, *editable("rr-core", "rr-fakes[demo]", "rr-megatron-compat", "rr-vllm")
    )
    session.run("rr", "demo", *(session.posargs or ["--plot", str(ROOT / "rr-demo.png")]))
