"""Install into a nox session's venv with uv where nox found it, pip otherwise, from the sources
pip is configured with, torch first.

uv reads none of pip's configuration, so the package sources this machine gives pip (``pip
config list``: its files and PIP_* variables — find-links, indexes, constraints, trusted hosts,
certificates) become uv's own flags, and uv finds what pip finds. pip merges every source and
takes the best match; uv's default stops at the first index that has a package, so the sources
are merged as pip does (``unsafe-best-match``). Nothing here names a path of any machine.

Each venv gets torch first and every later install is constrained to the exact torch it got
(``torch==2.13.0+cpu`` where the machine's pip takes a CPU build), so no dependency can swap in
a multi-GB CUDA build. uv has no ``--ignore-requires-python``: an install that needs it goes to
the venv's own pip (put there by uv on first use), which reads pip's configuration itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TORCH = "torch==2.13.0"

#: pip options (``pip config list`` keys) and the uv flag each becomes; a value holds one or
#: more whitespace-separated entries, each passed as its own flag.
_UV_FLAG_OF = {
    "index-url": "--default-index",
    "extra-index-url": "--index",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
#: pip's boolean options uv has.
_UV_SWITCH_OF = {"no-index": "--no-index"}
#: pip's names for the same option (pip accepts both spellings).
_ALIASES = {"constraints": "constraint", "timeout": "default-timeout"}
#: Sections by precedence, highest last: ``[global]``, then ``[install]`` (what pip install
#: reads over global), then the PIP_* variables.
_SECTIONS = ("global", "install", ":env:")
_TRUE = {"1", "true", "yes", "on"}


def pip_config(listing: str) -> dict[str, str]:
    """pip's effective install options from ``pip config list`` output (``section.key='value'``
    lines), each key with the value of its highest-precedence section."""
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot) or section not in _SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        key = _ALIASES.get(key.strip(), key.strip())
        found.setdefault(key, {})[section] = str(value)
    return {k: by[max(by, key=_SECTIONS.index)] for k, by in found.items()}


def uv_flags(config: Mapping[str, str]) -> list[str]:
    """The ``uv pip install`` flags that give uv the sources ``config`` gives pip."""
    flags: list[str] = []
    for key, flag in _UV_FLAG_OF.items():
        for entry in config.get(key, "").split():
            flags += [flag, entry]
    flags += [flag for key, flag in _UV_SWITCH_OF.items() if config.get(key, "").lower() in _TRUE]
    if any(key in config for key in ("extra-index-url", "find-links")):
        flags += ["--index-strategy", "unsafe-best-match"]  # pip's way: best version anywhere
    return flags


def uv_environment(config: Mapping[str, str]) -> dict[str, str]:
    """Variables for uv: pip's certificate bundle and timeout."""
    env = {}
    if config.get("cert"):
        env["SSL_CERT_FILE"] = config["cert"]
    if config.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = config["default-timeout"].split(".")[0]
    return env


def machine_pip_config() -> dict[str, str]:
    """This machine's pip configuration, read with the pip of the Python running nox (empty
    where that Python has no pip)."""
    try:
        listing = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return pip_config(listing)


def uses_uv(session: Any) -> bool:
    """The session's venv was made by uv (so ``session.install`` runs ``uv pip install``)."""
    return getattr(getattr(session, "virtualenv", None), "venv_backend", None) == "uv"


class Installer:
    """Installs into one session's venv: ``install(*pip_args)``, ``with_torch(*pip_args)``."""

    def __init__(self, session: Any, config: Mapping[str, str]) -> None:
        self._session = session
        self._uv = uses_uv(session)
        self._flags = uv_flags(config)
        self._env = uv_environment(config)
        self._constraint: Path | None = None
        self._has_pip = not self._uv  # a uv venv starts without pip

    def install(self, *args: str) -> None:
        """``pip install *args``, by uv where the venv is uv's (pip's flags translated)."""
        if not self._uv:
            self._session.install(*args)
        elif "--ignore-requires-python" in args:  # uv has no such switch
            self._pip(*args)
        else:
            args = tuple("--reinstall" if a == "--force-reinstall" else a for a in args)
            self._session.install(*self._flags, *args, env=self._env)

    def uninstall(self, *names: str) -> None:
        """Remove ``names`` from the venv (those not installed are skipped)."""
        if self._uv:
            self._session.run_install("uv", "pip", "uninstall", *names, env=self._env)
        else:
            self._session.run_install("python", "-m", "pip", "uninstall", "--yes", *names)

    def with_torch(self, *args: str) -> None:
        """Install torch first (once per venv), then ``args`` constrained to that torch."""
        constraint = self.torch_constraint()
        if args:
            self.install("-c", str(constraint), *args)

    def torch_constraint(self) -> Path:
        """A constraints file pinning the exact torch this venv holds, installed on first use."""
        if self._constraint is None:
            self.install(TORCH)
            version = self._session.run_install(
                "python", "-c", "import importlib.metadata as m; print(m.version('torch'))",
                silent=True,
            )  # fmt: skip
            # the exact build: '2.13.0+cpu' admits no CUDA '2.13.0'
            pin = f"torch=={version.strip()}" if isinstance(version, str) else TORCH
            path = Path(self._session.create_tmp()) / "torch-constraint.txt"
            path.write_text(pin + "\n")
            self._constraint = path
        return self._constraint

    def _pip(self, *args: str) -> None:
        if not self._has_pip:
            self._session.install(*self._flags, "pip", env=self._env)
            self._has_pip = True
        self._session.run_install("python", "-m", "pip", "install", "--quiet", *args)
