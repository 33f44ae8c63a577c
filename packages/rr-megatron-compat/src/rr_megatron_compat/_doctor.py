"""``rr megatron``: the Megatron view of ``rr doctor``: the installed line, whether it has native
routing replay, which hooks ``install()`` would use, and the line's known issues.

Package metadata only: importing this module (or running the command) imports neither torch
nor megatron.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rr_megatron_compat._supported import KNOWN_ISSUES, SUPPORTED
from rr_megatron_compat._versions import DISTRIBUTION, hook_specs, installed_version, line_flags


def megatron_report() -> dict[str, Any]:
    """The view as data."""
    found = installed_version()
    report: dict[str, Any] = {
        "distribution": DISTRIBUTION,
        "supported": SUPPORTED[DISTRIBUTION],
        "version": None if found is None else str(found),
    }
    if found is None:
        return report
    line = line_flags(found)
    report.update(
        line=line.line,
        in_range=line.supported,
        native_replay=line.native_replay,
        hooks=[spec.name for spec in hook_specs(line)],
        known_issues=list(KNOWN_ISSUES.get(line.line, ())),
    )
    return report


def render(report: dict[str, Any]) -> str:
    if report["version"] is None:
        return f"megatron-core  not installed (supported {report['supported']})"
    verdict = "ok" if report["in_range"] else "OUTSIDE the supported range"
    lines = [
        f"megatron-core  {report['version']}  {verdict} (supported {report['supported']})",
        f"native routing replay (RouterReplay)  {'yes' if report['native_replay'] else 'no'}",
        "hooks install() uses:",
        *(f"  {name}" for name in report["hooks"]),
        "known issues of this line:",
        *(f"  - {issue}" for issue in report["known_issues"] or ["none recorded"]),
    ]
    return "\n".join(lines)


def doctor_section() -> tuple[dict[str, Any], str]:
    """This view as a section of ``rr doctor`` (entry point ``rr.doctor``)."""
    report = megatron_report()
    return report, render(report)


def _run(args: argparse.Namespace) -> int:
    report = megatron_report()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if report.get("in_range") is False else 0


def register(commands: Any) -> None:
    """Add ``rr megatron`` to the ``rr`` command (entry point ``rr.commands``)."""
    parser = commands.add_parser("megatron", help="the installed megatron-core line and rr's hooks")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_run)
