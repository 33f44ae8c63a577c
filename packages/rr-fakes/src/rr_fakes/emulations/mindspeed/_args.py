"""MindSpeed's global arguments (``mindspeed/args_utils.py``, identical on 26.1.0_core_r0.12.1,
core_r0.16.0, core_r0.17.0 and core_r0.18.0).

``get_mindspeed_args()`` builds a parser from every feature's flags and parses the process's
command line (``parse_known_args()``: ``sys.argv[1:]``) once; what the parser does not know is
kept too (``parser_unknown_args``): ``--name value`` gives a string, several values a list,
``--name=value`` a string, a bare ``--flag`` True, and the key is the option minus its first two
characters with ``-`` made ``_`` (so a single-dash option such as pytest's ``-q`` gives the key
``''``). ``get_full_args()`` answers Megatron's training arguments where
``megatron.training`` imports and they are set, else the MindSpeed arguments.
"""

from __future__ import annotations

import importlib
from argparse import ArgumentParser, Namespace
from collections.abc import Sequence
from typing import Any


def _add(args: dict[str, Any], key: str | None, value: list[str] | None) -> None:
    if key is not None:
        args[key[2:].replace("-", "_")] = (
            True if value is None else value[0] if len(value) == 1 else value
        )


def parser_unknown_args(args: dict[str, Any], unknown: Sequence[str]) -> dict[str, Any]:
    key: str | None = None
    value: list[str] | None = None
    for item in unknown:
        if item.startswith("-"):
            _add(args, key, value)
            option, equals, given = item.partition("=")
            key, value = (option, [given]) if equals else (item, None)
        elif value is None:
            value = [item]
        else:
            value.append(item)
    _add(args, key, value)
    return args


def parse_mindspeed_args(parser: ArgumentParser, argv: Sequence[str] | None) -> Namespace:
    """``parser.parse_known_args(argv)`` (``None``: ``sys.argv[1:]``) plus the unknown ones."""
    known, unknown = parser.parse_known_args(None if argv is None else list(argv))
    return Namespace(**parser_unknown_args(vars(known), unknown))


def megatron_training_args() -> Namespace | None:
    """``megatron.training.global_vars.get_args()`` where it imports and is set, else None."""
    try:
        global_vars = importlib.import_module("megatron.training.global_vars")
    except ImportError:
        return None
    try:
        args = global_vars.get_args()
    except AssertionError as error:
        if "args is not initialized." in str(error):
            return None
        raise
    return args if isinstance(args, Namespace) else None
