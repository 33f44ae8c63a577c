"""Where a nox run's minutes go: each session's venv, install, test and other time, recorded as
the session runs and printed as one table at the end of the run (the ``timings`` session).

Records are JSON lines in ``.nox/rr-timings.jsonl`` keyed by the nox process, so a table shows
one run; "venv" is the time between the previous session's end and this one's start (nox
creating the venv, and dropping the previous one), 0 for a run's first session.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from noxsupport import installer

KINDS = ("install", "tests", "other")
#: Commands whose time is a session's checking time (the lint session's checks are its tests).
CHECKS = frozenset({"pytest", "ruff", "mypy", "lint-imports"})


def _kind(args: tuple[Any, ...]) -> str:
    """What a ``session.run`` command is: an install, a test run, or anything else."""
    words = [str(a) for a in args[:4]]
    if words[:1] and words[0] in CHECKS:
        return "tests"
    if words[:1] == ["uv"] or words[1:4] == ["-m", "pip", "install"]:
        return "install"
    return "other"


class Stopwatch:
    """A nox session whose ``install`` and ``run`` calls are timed by kind; everything else
    passes through to the session."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.started = time.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    @contextmanager
    def _timed(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - start

    def install(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed("install"):
            return self._session.install(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed(_kind(args)):
            return self._session.run(*args, **kwargs)

    def run_install(self, *args: Any, **kwargs: Any) -> Any:
        """A command that installs (it runs under ``nox --install-only`` too)."""
        with self._timed("install"):
            return self._session.run_install(*args, **kwargs)


def record(path: Path, name: str, watch: Stopwatch, ok: bool) -> None:
    """Append one session's figures to ``path`` (one JSON object a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "run": os.getpid(), "session": name, "ok": ok, "start": watch.started,
        "end": time.time(), **{k: round(v, 1) for k, v in watch.seconds.items()},
    }  # fmt: skip
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


def last_run(path: Path) -> list[dict[str, Any]]:
    """The records of this nox process's run, or of the newest run recorded."""
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [e["run"] for e in entries]
    run = os.getpid() if os.getpid() in runs else (runs[-1] if runs else None)
    return [e for e in entries if e["run"] == run]


def table(entries: list[dict[str, Any]]) -> str:
    """Minutes per session (venv, install, tests, other, total) and the run's sum."""
    if not entries:
        return "no session timings recorded"
    rows, previous_end = [], entries[0]["start"]
    sums = dict.fromkeys(("venv", *KINDS, "total"), 0.0)
    for e in entries:
        venv = max(0.0, e["start"] - previous_end)
        figures = {"venv": venv, **{k: e[k] for k in KINDS}, "total": venv + e["end"] - e["start"]}
        previous_end = e["end"]
        for k, v in figures.items():
            sums[k] += v
        rows.append((e["session"] + ("" if e["ok"] else " (failed)"), figures))
    rows.append(("all sessions", sums))
    width = max(len(name) for name, _ in rows)
    head = f"{'session':<{width}}  " + "  ".join(f"{k:>7}" for k in sums) + "   (minutes)"
    body = [
        f"{name:<{width}}  " + "  ".join(f"{v / 60:7.1f}" for v in figures.values())
        for name, figures in rows
    ]
    return "\n".join([head, *body])


@functools.cache
def _pip_sources() -> dict[str, str]:
    """This machine's pip configuration (read once per nox run), which uv is given too."""
    return installer.machine_pip_config()


def timed_session(
    nox_session: Callable[..., Any], path: Path, **kwargs: Any
) -> Callable[[Callable[..., None]], object]:
    """``nox_session(**kwargs)`` (nox's decorator) whose body gets a timed session with an
    installer, records its minutes in ``path`` for the ``timings`` table and, with
    RR_NOX_DROP_VENVS=1 (CI), deletes its venv once it ends, pass or fail (each venv of the pip
    backend holds its own ~1 GB torch)."""

    def decorate(body: Callable[..., None]) -> object:
        @functools.wraps(body)  # keeps nox.parametrize's marks and the signature
        def run(session: Any, **params: Any) -> None:
            watch = Stopwatch(session)
            watch.installer = installer.Installer(watch, _pip_sources())
            ok = False
            try:
                body(watch, **params)
                ok = True
            finally:
                record(path, getattr(session, "name", body.__name__), watch, ok)
                location = getattr(session.virtualenv, "location", None)
                if os.environ.get("RR_NOX_DROP_VENVS") == "1" and location:
                    session.log(f"dropping {location}")
                    shutil.rmtree(location, ignore_errors=True)

        return nox_session(**kwargs)(run)

    return decorate
