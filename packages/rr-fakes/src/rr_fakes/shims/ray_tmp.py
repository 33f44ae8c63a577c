"""A temporary folder for a local Ray cluster that Ray's workers accept.

nox points ``TMPDIR`` into the session's virtualenv (``.nox/<session>/tmp``), where Ray puts its
session folder by default; Ray's workers then refuse to start ("temp_dir must not be child
directory of virtualenv root", ``ray._private.parameter``) and the driver waits for workers that
never register. A job or test that starts Ray gives it ``TMPDIR`` from here."""

from __future__ import annotations

import tempfile
from pathlib import Path

#: Short on purpose: Ray's Unix sockets live under it (a socket path holds at most 107 bytes).
ROOT = "/tmp"


def ray_tmpdir() -> Path:
    """A new folder outside every virtualenv, for the ``TMPDIR`` of Ray's processes."""
    return Path(tempfile.mkdtemp(prefix="rr-ray-", dir=ROOT))
