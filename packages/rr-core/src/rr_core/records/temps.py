"""Temporary files of atomic writes: named so that a killed writer's leftovers can be told apart
from a live writer's and removed safely.

A temporary file is ``.<name>.<host>-<pid>.<random>.tmp`` beside its destination ``<name>``:
``host`` is a short hash of the writer's host name, ``pid`` its process id. A leftover is stale
when its writer ran on this host and is gone, or when nobody has written to it for
:data:`STALE_AFTER_S` (the only test that holds on a file system shared between hosts, and for
the older ``.<name>.<random>.tmp`` names that carry no writer). A live writer's file is never
stale: it runs on this host with its pid alive, or it wrote to its file within the last hour.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

STALE_AFTER_S = 3600.0
_TEMP = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<host>[0-9a-f]{8})-(?P<pid>\d+)\.)?[a-z0-9_]+\.tmp$")


def host_tag() -> str:
    """Eight hex digits naming this host in temporary file names."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


#: Bytes of a destination name kept whole in its temporary files' names: the rest of a temporary
#: name takes about 30, and file systems allow 255 bytes a name.
NAME_BYTES = 200


def temp_stem(name: str) -> str:
    """How temporary files name destination ``name``: whole up to :data:`NAME_BYTES` bytes, a
    longer one cut with a hash of the whole appended (a name at the file system's limit must
    still get a temporary file beside it)."""
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name.encode()[: NAME_BYTES - 17].decode(errors="ignore") + "~" + digest


def temp_prefix(name: str) -> str:
    """The ``mkstemp`` prefix of this process's temporary files for destination ``name``."""
    return f".{temp_stem(name)}.{host_tag()}-{os.getpid()}."


@dataclass(frozen=True)
class TempFile:
    """A temporary file of an atomic write, left in place or still being written."""

    path: Path
    destination: str
    host: str | None
    pid: int | None

    def stale(self, *, now: float | None = None) -> bool:
        """Whether its writer is gone, so that removing it cannot hurt a write in progress."""
        try:
            age = (time.time() if now is None else now) - self.path.stat().st_mtime
        except FileNotFoundError:
            return False  # renamed or removed meanwhile: nothing to clean
        if age > STALE_AFTER_S:
            return True
        if self.pid is None or self.host != host_tag():
            return False
        return not _alive(self.pid)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True  # no cheap liveness test: the age rule alone decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, owned by someone else
        return True
    return True


def parse_temp(path: Path) -> TempFile | None:
    """The temporary file ``path`` names, or None when it is not one."""
    m = _TEMP.match(path.name)
    if m is None:
        return None
    pid = m.group("pid")
    return TempFile(path, m.group("name"), m.group("host"), None if pid is None else int(pid))


def temp_files(directory: Path, destination: str | None = None) -> list[TempFile]:
    """Temporary files in ``directory`` (those of ``destination`` only, when given)."""
    stem = None if destination is None else temp_stem(destination)
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            t = parse_temp(Path(entry.path))
            if t is not None and stem in (None, t.destination):
                found.append(t)
    return sorted(found, key=lambda t: t.path.name)


def clean_stale(directory: Path, destination: str | None = None) -> list[Path]:
    """Remove the stale temporary files in ``directory`` (of ``destination``); returns them."""
    removed = []
    for t in temp_files(directory, destination):
        if t.stale():
            with contextlib.suppress(FileNotFoundError):
                t.path.unlink()
                removed.append(t.path)
    return removed
