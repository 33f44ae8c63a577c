"""The rr command: version, doctor, plugin discovery, and no torch import at start-up."""

from __future__ import annotations

import json
import sys
from importlib.metadata import EntryPoint
from typing import Any

import pytest

import rr_core
from rr_core.cli import doctor as _doctor
from rr_core.cli import main as _cli

from rr_core_testing import rr_without_torch


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"rr {rr_core.__version__}"


def test_doctor_json_reports_packages_and_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    code = _cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["rr-core"]["version"] == rr_core.__version__
    assert report["torch"]["supported"] is not None
    assert report["torch"]["ok"] is True
    for dist in ("megatron-core", "vllm", "torch-npu", "mindspeed"):
        assert dist in report


def test_doctor_flags_a_version_outside_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_doctor, "supported_ranges", lambda: {"torch": ">=99"})
    findings = {f.name: f for f in _doctor.diagnose()}
    assert findings["torch"].ok is False
    assert "OUTSIDE the supported range" in _doctor.render(list(findings.values()))
    assert _cli.main(["doctor"]) == 1


def test_doctor_merges_ranges_published_by_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    tables = {
        "a": {"megatron-core": ">=0.12,<0.20"},
        "b": {"megatron-core": "!=0.13.0"},
    }

    class FakeEntry:
        def __init__(self, name: str) -> None:
            self.name = name

        def load(self) -> dict[str, str]:
            return tables[self.name]

    monkeypatch.setattr(_doctor, "entry_points", lambda group: [FakeEntry("a"), FakeEntry("b")])
    merged = _doctor.supported_ranges()
    assert set(merged["megatron-core"].split(",")) == {">=0.12", "<0.20", "!=0.13.0"}


def test_subcommands_come_from_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def register_hello(commands: Any) -> None:
        parser = commands.add_parser("hello")
        parser.set_defaults(func=lambda args: print("hi") or 0)

    sys.modules[__name__].register_hello = register_hello  # type: ignore[attr-defined]
    plugins = [
        EntryPoint("hello", f"{__name__}:register_hello", _cli.COMMAND_GROUP),
        EntryPoint("broken", "no_such_module_xyz:register", _cli.COMMAND_GROUP),
    ]
    monkeypatch.setattr(_cli, "entry_points", lambda group: plugins)
    assert _cli.main(["hello"]) == 0
    assert capsys.readouterr().out == "hi\n"
    assert _cli.main(["broken"]) == 2
    assert "cannot load this command" in capsys.readouterr().err


def test_cli_and_doctor_do_not_import_torch() -> None:
    """rr doctor must answer where importing torch fails (torch-npu without CANN)."""
    assert "rr-core" in rr_without_torch("doctor").stdout


def test_lazy_public_names_resolve() -> None:
    for name in rr_core.__all__:
        assert getattr(rr_core, name) is not None
    with pytest.raises(AttributeError, match="nope"):
        rr_core.nope  # noqa: B018


def test_doctor_shows_sections_published_by_packages(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def good() -> tuple[dict[str, str], str]:
        return {"line": "0.16"}, "megatron-core  0.16.1  ok"

    def broken() -> tuple[dict[str, str], str]:
        raise ImportError("libhccl.so")

    class FakeEntry:
        def __init__(self, name: str, fn: Any) -> None:
            self.name, self._fn = name, fn

        def load(self) -> Any:
            return self._fn

    real = _doctor.entry_points

    def fake(group: str) -> Any:
        if group == _doctor.SECTIONS_GROUP:
            return [FakeEntry("megatron", good), FakeEntry("npu", broken)]
        return real(group=group)

    monkeypatch.setattr(_doctor, "entry_points", fake)
    assert _cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[megatron]\nmegatron-core  0.16.1  ok" in out
    assert "[npu]\nunavailable: ImportError: libhccl.so" in out
    _cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["sections"]["megatron"] == {"line": "0.16"}
    assert "libhccl.so" in report["sections"]["npu"]["error"]
