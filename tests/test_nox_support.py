"""The noxfile's installer gives uv the sources pip is configured with, and its stopwatch's table
adds up: tested on the functions the noxfile calls, with pip's own configuration output."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from noxsupport import installer, timings  # the noxfile's own modules

LISTING = """\
:env:.find-links='/env/wheels'
:env:.default-timeout='180'
global.cert='/certs/bundle.crt'
global.constraint='/etc/pip/caps.txt'
global.extra-index-url='file:///mirror/simple https://extra.example/simple'
global.find-links='/global/wheels'
global.trusted-host='extra.example'
install.no-index='false'
"""


def test_pip_config_takes_the_highest_section_per_key() -> None:
    config = installer.pip_config(LISTING + "not a config line\n")
    assert config["find-links"] == "/env/wheels"  # PIP_FIND_LINKS over the file, as pip does
    assert config["extra-index-url"].split() == [
        "file:///mirror/simple",
        "https://extra.example/simple",
    ]
    assert config["constraint"] == "/etc/pip/caps.txt"
    assert installer.pip_config("install.timeout='5'\nglobal.timeout='9'") == {
        "default-timeout": "5"  # [install] over [global]; pip's two spellings are one option
    }


def test_uv_gets_every_source_and_pips_merge_strategy() -> None:
    flags = installer.uv_flags(installer.pip_config(LISTING))
    pairs = list(zip(flags[::2], flags[1::2], strict=False))
    assert ("--index", "file:///mirror/simple") in pairs
    assert ("--index", "https://extra.example/simple") in pairs
    assert ("--find-links", "/env/wheels") in pairs
    assert ("--constraint", "/etc/pip/caps.txt") in pairs
    assert ("--allow-insecure-host", "extra.example") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs
    assert "--no-index" not in flags  # 'false' is off
    env = installer.uv_environment(installer.pip_config(LISTING))
    assert env == {"SSL_CERT_FILE": "/certs/bundle.crt", "UV_HTTP_TIMEOUT": "180"}
    assert installer.uv_flags({}) == []  # no pip sources: uv's own defaults


def test_machine_pip_config_is_what_pip_reports() -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    if listing.returncode != 0:
        pytest.skip("this Python has no pip")
    assert installer.machine_pip_config() == installer.pip_config(listing.stdout)


class FakeSession:
    """What the installer touches of a nox session, recording each call."""

    def __init__(self, backend: str, tmp: Path, torch_version: str = "2.13.0+cpu\n") -> None:
        self.virtualenv = types.SimpleNamespace(venv_backend=backend, location=str(tmp))
        self.calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
        self._tmp, self._torch = tmp, torch_version

    def install(self, *args: str, **kwargs: Any) -> None:
        self.calls.append(("install", args, kwargs))

    def run(self, *args: str, **kwargs: Any) -> str | None:
        self.calls.append(("run", args, kwargs))
        return self._torch if "import importlib.metadata as m" in " ".join(args) else None

    def run_install(self, *args: str, **kwargs: Any) -> str | None:
        """Every command the installer runs: under ``nox --install-only`` only these run."""
        self.calls.append(("run_install", args, kwargs))
        return self._torch if "import importlib.metadata as m" in " ".join(args) else None

    def create_tmp(self) -> str:
        return str(self._tmp)


def test_uv_venv_installs_torch_first_then_pins_its_exact_build(tmp_path: Path) -> None:
    session = FakeSession("uv", tmp_path)
    config = {"find-links": "/w", "cert": "/c.crt"}
    tool = installer.Installer(session, config)
    tool.with_torch("numpy", "--force-reinstall")
    tool.with_torch("ruff")
    installs = [args for kind, args, _ in session.calls if kind == "install"]
    assert installs[0][-1] == installer.TORCH  # torch alone, first, once
    assert [a[-1] for a in installs].count(installer.TORCH) == 1
    assert all(a[:2] == ("--find-links", "/w") for a in installs)
    assert "--reinstall" in installs[1]  # uv's spelling of pip's --force-reinstall
    assert "--force-reinstall" not in installs[1]
    constraint = Path(installs[1][installs[1].index("-c") + 1])
    assert constraint.read_text() == "torch==2.13.0+cpu\n"  # no CUDA '2.13.0' fits it
    envs = [kw.get("env") for kind, _, kw in session.calls if kind == "install"]
    assert envs == [{"SSL_CERT_FILE": "/c.crt"}] * 3


def test_requires_python_override_goes_to_the_venvs_pip(tmp_path: Path) -> None:
    session = FakeSession("uv", tmp_path)
    tool = installer.Installer(session, {})
    tool.install("--ignore-requires-python", "megatron-core==0.19.2")
    tool.install("--ignore-requires-python", "megatron-bridge==0.6.2")
    assert [c[1] for c in session.calls if c[0] == "install"] == [("pip",)]  # pip put in once
    pip_runs = [c[1] for c in session.calls if c[0] == "run_install"]
    assert all(r[:4] == ("python", "-m", "pip", "install") for r in pip_runs)
    assert pip_runs[-1][-1] == "megatron-bridge==0.6.2"


def test_pip_venv_passes_arguments_through(tmp_path: Path) -> None:
    session = FakeSession("venv", tmp_path)
    installer.Installer(session, {"find-links": "/w"}).install("--force-reinstall", "x==1")
    assert session.calls == [("install", ("--force-reinstall", "x==1"), {})]  # pip reads its own


def test_stopwatch_table_adds_up(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    first = timings.Stopwatch(FakeSession("uv", tmp_path))
    first.install("x")
    first.run("pytest", "-q")
    first.run("python", "-m", "pip", "install", "y")
    first.run("rr", "doctor")
    timings.record(path, "core", first, ok=True)
    timings.record(path, "vllm", timings.Stopwatch(FakeSession("uv", tmp_path)), ok=False)
    entries = timings.last_run(path)
    assert [e["session"] for e in entries] == ["core", "vllm"]
    assert all(e[k] >= 0 for e in entries for k in timings.KINDS)
    text = timings.table(entries)
    assert "vllm (failed)" in text
    assert text.splitlines()[-1].startswith("all sessions")
    other_run = {**json.loads(path.read_text().splitlines()[0]), "run": -1}
    with path.open("a") as handle:
        handle.write(json.dumps(other_run) + "\n")
    assert len(timings.last_run(path)) == 2  # this process's run, not the other one
    assert timings.table([]) == "no session timings recorded"


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (("pytest", "-q"), "tests"),
        (("mypy", "src"), "tests"),
        (("python", "-m", "pip", "install", "x"), "install"),
        (("uv", "pip", "uninstall", "x"), "install"),
        (("rr", "doctor"), "other"),
        (("python", "-c", "print()"), "other"),
    ],
)
def test_each_command_is_timed_as_its_kind(command: tuple[str, ...], kind: str) -> None:
    assert timings._kind(command) == kind


@pytest.mark.parametrize(
    ("posargs", "device"),
    [
        ([], "cpu"),
        (["--device", "cuda"], "cuda"),
        (["--device=cuda:1"], "cuda:1"),
        (["--device"], "cpu"),
    ],
)
def test_bench_gives_the_device_to_the_replay_benchmarks_only(
    posargs: list[str], device: str
) -> None:
    from noxsupport.bench_report import BENCHMARKS, DEVICE_BENCHMARKS, bench_commands

    commands = bench_commands(Path("/p"), posargs)
    assert list(commands) == list(BENCHMARKS)
    for name, command in commands.items():
        assert command[:3] == ["python", f"/p/{BENCHMARKS[name]}", "--json"]
        assert command[3:] == (["--device", device] if name in DEVICE_BENCHMARKS else [])
