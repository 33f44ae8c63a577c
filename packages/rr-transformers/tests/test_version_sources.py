"""The installed transformers' version read from what a user's environment holds: a version
string that names no release, or a checkout importable without metadata, is refused by name
(packaging's InvalidVersion or "not installed" would hide the cause)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from importlib import metadata

import pytest

from rr_transformers import TransformersVersionError, _versions


@pytest.mark.parametrize("text", ["main", "unknown", ""])
def test_a_version_that_names_no_release_is_refused_by_name(monkeypatch, text):
    monkeypatch.setattr(_versions.metadata, "version", lambda _name: text)
    with pytest.raises(TransformersVersionError, match=f"version as {text!r}, which names no"):
        _versions.installed_transformers_version()


def test_a_checkout_without_metadata_is_named_not_called_missing(monkeypatch, tmp_path):
    def no_metadata(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    origin = str(tmp_path / "transformers" / "__init__.py")
    spec = importlib.machinery.ModuleSpec("transformers", None, origin=origin)
    monkeypatch.setattr(_versions.metadata, "version", no_metadata)
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: spec)
    with pytest.raises(TransformersVersionError, match="source checkout") as error:
        _versions.installed_transformers_version()
    assert origin in str(error.value)


def test_transformers_absent_reads_as_absent(monkeypatch):
    def no_metadata(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_versions.metadata, "version", no_metadata)
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    assert _versions.installed_transformers_version() is None


def test_a_release_reads_as_that_release(monkeypatch):
    monkeypatch.setattr(_versions.metadata, "version", lambda _name: "5.25.0")
    assert str(_versions.installed_transformers_version()) == "5.25.0"
