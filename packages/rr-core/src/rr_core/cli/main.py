"""The ``rr`` command. Subcommands come from the ``rr.commands`` entry-point group: each entry
point is a ``register(subparsers)`` function, so every rr package can add its own commands.

This module and the commands it registers import no torch at start-up, so ``rr doctor`` still
answers on a machine where importing torch fails (e.g. torch-npu installed without CANN).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from rr_core import __version__

COMMAND_GROUP = "rr.commands"


def build_parser() -> argparse.ArgumentParser:
    """The ``rr`` parser with every registered subcommand attached."""
    parser = argparse.ArgumentParser(prog="rr", description="Exact MoE routing replay.")
    parser.add_argument("--version", action="version", version=f"rr {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            register = entry.load()
        except Exception as exc:  # one broken plugin must not take the whole CLI down
            broken = commands.add_parser(entry.name, help=f"(unavailable: {exc})")
            broken.set_defaults(func=_unavailable(entry.name, exc))
            continue
        register(commands)
    return parser


def _unavailable(name: str, exc: Exception) -> object:
    def run(_: argparse.Namespace) -> int:
        print(f"rr {name}: cannot load this command: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rr`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
