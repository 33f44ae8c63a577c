"""Atomic file replacement: a process killed at any instant leaves the old file or the new one.

The bytes go to a temporary file in the destination's directory (a rename is only atomic within
one file system), are forced to disk with ``fsync`` (``os.write`` is unbuffered, so there is no
user-space buffer to flush), the temporary file is renamed over the destination, and the
directory itself is fsynced so that the rename survives a power loss. A kill before the rename
can leave a ``.<name>.<host>-<pid>.*.tmp`` file behind (see :mod:`rr_core.records.temps`):
readers never look at those, and the next write to the same destination removes the ones whose
writer is gone.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from rr_core.checks import describe
from rr_core.errors import RecordFileError
from rr_core.records.temps import clean_stale, temp_prefix

# Bytes per os.write call; each call may also write less, which the loop absorbs.
CHUNK_BYTES = 1 << 24


def fsync_directory(directory: Path) -> None:
    """Persist a directory entry change (a rename). A no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directory entries are durable once the rename returns
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_path(value: object, what: str = "path") -> Path:
    """``value`` as a :class:`~pathlib.Path`: a non-empty str or ``os.PathLike`` of str (rr's
    records are named in text, so bytes paths are refused), without NUL."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text or "\0" in text:
        raise RecordFileError(
            f"{what} must be a file-system path (a non-empty str or pathlib.Path); got "
            f"{describe(value)}"
        )
    return Path(text)


def atomic_write(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> Path:
    """Replace ``path`` by ``data`` atomically and durably; returns the path. What the file
    system refuses (a directory in the way, no permission, no space) raises
    :class:`~rr_core.RecordFileError` and leaves the old file."""
    target = as_path(path)
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise RecordFileError(f"{target}: atomic_write takes bytes; got {describe(data)}") from exc
    if target.is_dir():
        raise RecordFileError(f"{target} is a directory; name the file to write")
    try:
        _replace(target, view)
    except OSError as exc:
        raise RecordFileError(f"{target}: cannot write ({exc.strerror or exc})") from exc
    return target


def _replace(target: Path, view: memoryview) -> None:
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=temp_prefix(target.name), suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):  # mkstemp creates 0600; a record is meant to be shared
            os.fchmod(fd, 0o644)
        try:
            while view.nbytes:
                written = os.write(fd, view[:CHUNK_BYTES])
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)
    with contextlib.suppress(OSError):  # tidying up is best effort; the write itself is done
        clean_stale(directory, target.name)
