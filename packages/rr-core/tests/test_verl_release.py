"""The one verl release check every verl side runs: each way the release is missing or
unreadable is named (no PackageNotFoundError, ModuleNotFoundError or InvalidVersion)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest

from rr_core.verl_release import VERL_SPECIFIER, VerlReleaseError, check_verl_release


def _version_reads(monkeypatch: pytest.MonkeyPatch, text: str | None) -> None:
    def version(name: str) -> str:
        if name != "verl" or text is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return text

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_a_verl_checkout_in_the_working_directory_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "__init__.py").write_text("")
    _version_reads(monkeypatch, None)  # a source tree has no installed distribution
    monkeypatch.syspath_prepend(str(tmp_path))  # as a checkout in the working directory is
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    with pytest.raises(VerlReleaseError, match="no installed verl distribution") as caught:
        check_verl_release("rr_megatron_compat.verl.install()")
    assert str(tmp_path / "verl") in str(caught.value)


def test_verl_not_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _version_reads(monkeypatch, None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VerlReleaseError, match="verl is not installed"):
        check_verl_release("x.install()")


@pytest.mark.parametrize("text", ["main", "unknown", ""])
def test_a_version_that_is_no_release_is_named_and_force_passes_it(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    _version_reads(monkeypatch, text)
    with pytest.raises(VerlReleaseError, match=f"reads {text!r}, which is no release"):
        check_verl_release("x.install()")
    assert check_verl_release("x.install()", force=True) is None


@pytest.mark.parametrize(("text", "inside"), [("0.9.1", True), ("0.9.5", True), ("0.10.0", False)])
def test_releases_are_held_to_the_one_range(
    monkeypatch: pytest.MonkeyPatch, text: str, inside: bool
) -> None:
    _version_reads(monkeypatch, text)
    if inside:
        assert str(check_verl_release("x.install()")) == text
    else:
        with pytest.raises(VerlReleaseError, match=f"outside the tested range {VERL_SPECIFIER}"):
            check_verl_release("x.install()")
        assert str(check_verl_release("x.install()", force=True)) == text
