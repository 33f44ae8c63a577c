"""The ``rr doctor`` section of rr-transformers: the installed release against the supported
range, and which families rr replays in it, with where each one's top-k step is hooked. Reads
package metadata and the family table only; transformers is not imported."""

from __future__ import annotations

from typing import Any

from rr_transformers._errors import TransformersVersionError
from rr_transformers._families import KNOWN_FAMILIES
from rr_transformers._supported import SUPPORTED, TESTED_RELEASES
from rr_transformers._versions import (
    check_transformers_version,
    installed_transformers_version,
    newer_than_tested,
)


def transformers_report() -> dict[str, Any]:
    version = installed_transformers_version()
    supported = SUPPORTED["transformers"]
    families: dict[str, str | None] = {}
    for name, family in KNOWN_FAMILIES.items():
        if version is None or not family.available(version):
            families[name] = None
        else:
            owner, attribute, _ = family.hook_names(version)
            families[name] = f"{owner}.{attribute}"
    return {
        "transformers": None if version is None else str(version),
        "supported": supported,
        "ok": None if version is None else _accepted(version),
        "untested": None if version is None else newer_than_tested(version),
        "tested_lines": {release.rsplit(".", 1)[0]: release for release in TESTED_RELEASES},
        "families": families,
    }


def _accepted(version: Any) -> bool:
    try:
        check_transformers_version(version)
    except TransformersVersionError:
        return False
    return True


def render(report: dict[str, Any]) -> str:
    if report["transformers"] is None:
        return f"transformers  not installed (supported {report['supported']})"
    verdict = "ok" if report["ok"] else "REFUSED (outside the range or known to break)"
    if report["ok"] and report["untested"]:
        verdict = "newer than the tested lines: attach proves the hooks on each model"
    lines = [
        f"transformers  {report['transformers']}  (supported {report['supported']}): {verdict}"
    ]
    for name, site in report["families"].items():
        lines.append(f"  {name:<18} {site or 'not in this release'}")
    return "\n".join(lines)


def doctor_section() -> tuple[dict[str, Any], str]:
    """This view as a section of ``rr doctor`` (entry point ``rr.doctor``)."""
    report = transformers_report()
    return report, render(report)
