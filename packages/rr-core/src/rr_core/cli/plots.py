"""What every ``--plot PATH`` option checks before any work, so a command that runs for minutes
never fails at its last step on a path it could have refused at once."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def plot_problem(out: Path | str, *, install: str) -> str | None:
    """Why a plot cannot be written to ``out`` (matplotlib missing, no such directory, a
    directory given, not writable), or None; ``install`` is the package extra that brings
    matplotlib (e.g. ``rr-core[plot]``)."""
    out = Path(out)
    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot needs matplotlib: pip install '{install}'"
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        return f"--plot {out}: no such directory {directory}; create it first"
    if out.is_dir():
        return f"--plot {out}: is a directory; name a .png file"
    if not os.access(directory, os.W_OK):
        return f"--plot {out}: directory {directory} is not writable"
    return None
