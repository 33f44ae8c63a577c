"""``rr explain [CODE]``: print a failure-catalogue entry, or list every code. Error messages
that cite a code end with "see `rr explain CODE`"; this is where that pointer leads."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rr_core.failures import FAILURE_MODES, GROUPS, failure_mode, render


def listing() -> str:
    """Every code with its title, by group."""
    lines: list[str] = []
    for letter, group in GROUPS.items():
        lines.append(f"{letter}  {group}")
        lines += [f"  {e.code:<4}{e.title}" for e in FAILURE_MODES.values() if e.code[0] == letter]
    lines.append("\n`rr explain CODE` prints the symptom, the cause and what rr does.")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if args.code is None:
        print(listing())
        return 0
    entry = failure_mode(args.code)
    if entry is None:
        known = ", ".join(FAILURE_MODES)
        print(f"rr explain: no failure code {args.code!r}; known codes: {known}", file=sys.stderr)
        return 2
    print(render(entry), end="")
    return 0


def register(commands: Any) -> None:
    """Add ``rr explain`` to the ``rr`` command (entry point ``rr.commands``)."""
    parser = commands.add_parser(
        "explain", help="explain a failure code cited by an rr error (A1, E4, ...)"
    )
    parser.add_argument("code", nargs="?", help="a failure code; omit it to list every code")
    parser.set_defaults(func=_run)
