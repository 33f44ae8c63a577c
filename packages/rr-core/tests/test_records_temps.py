"""Temporary files of killed writers: recognised, removed by the next write to the same
destination and by ``rr verify --clean``, never a running writer's, never read as records."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rr_core import RouteBatch
from rr_core.cli import main as _cli
from rr_core.records.file import load_routes, save_routes
from rr_core.records.shards import write_index, write_shard
from rr_core.records.temps import (
    NAME_BYTES,
    STALE_AFTER_S,
    host_tag,
    parse_temp,
    temp_files,
    temp_stem,
)

from rr_core_testing import random_batch


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def leftover(
    directory: Path, name: str, pid: int | None, *, age: float = 0.0, tail: str = "a1b2c3d4"
) -> Path:
    """A temporary file as a writer of ``name`` with ``pid`` would leave it."""
    tag = "" if pid is None else f"{host_tag()}-{pid}."
    path = directory / f".{name}.{tag}{tail}.tmp"
    path.write_bytes(b"half a record")
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


def batch() -> RouteBatch:
    return random_batch(np.random.default_rng(0), 60, 4, lengths=[3, 2], layers=2)


def test_temp_names_are_recognised() -> None:
    t = parse_temp(Path(f".step.rr.{host_tag()}-123.k3j_x9ab.tmp"))
    assert t is not None
    assert (t.destination, t.pid) == ("step.rr", 123)
    old = parse_temp(Path(".step.rr.k3j_x9ab.tmp"))  # written by rr-core before writer tags
    assert old is not None
    assert (old.destination, old.pid) == ("step.rr", None)
    for name in ("step.rr", ".step.rr", "step.rr.tmp", ".hidden"):
        assert parse_temp(Path(name)) is None


def test_the_next_write_removes_only_stale_temps_of_its_destination(tmp_path: Path) -> None:
    dead = leftover(tmp_path, "step.rr", dead_pid())
    mine = leftover(tmp_path, "step.rr", os.getpid())  # a write in progress in this process
    other_host = tmp_path / ".step.rr.00000000-1.a1b2c3d4.tmp"
    other_host.write_bytes(b"")
    untagged = leftover(tmp_path, "step.rr", None)
    ancient = leftover(tmp_path, "step.rr", None, age=STALE_AFTER_S + 60, tail="old_1234")
    elsewhere = leftover(tmp_path, "other.rr", dead_pid())
    save_routes(tmp_path / "step.rr", batch())
    assert not dead.exists()
    assert not ancient.exists()
    assert mine.exists()
    assert other_host.exists()
    assert untagged.exists()
    assert elsewhere.exists()
    assert {t.path for t in temp_files(tmp_path)} == {mine, other_host, untagged, elsewhere}


def test_a_running_writers_temp_is_kept(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = leftover(tmp_path, "step.rr", sleeper.pid)
        save_routes(tmp_path / "step.rr", batch())
        assert live.exists()
        assert _cli.main(["verify", "--clean", str(tmp_path)]) == 0
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _cli.main(["verify", "--clean", str(tmp_path / "step.rr")]) == 0
    assert not live.exists()


def test_verify_clean_a_directory_and_temps_are_never_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for r in range(2):
        write_shard(tmp_path, r, batch(), sample_ids=[2 * r, 2 * r + 1])
    dead = leftover(tmp_path, "routes-rank00001.safetensors", dead_pid())
    index = write_index(tmp_path)
    assert "tmp" not in index.read_text()  # the index lists shards only
    keep = leftover(tmp_path, "routes-rank00000.safetensors", os.getpid())
    assert _cli.main(["verify", str(keep)]) == 1
    assert "temporary file of an unfinished write" in capsys.readouterr().err
    assert _cli.main(["verify", "--clean", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"removed {dead}" in out
    assert f"kept {keep}" in out
    assert "OK" in out
    assert not dead.exists()
    assert keep.exists()


def test_verify_a_directory_without_an_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli.main(["verify", str(tmp_path)]) == 1
    assert "no index.json and no" in capsys.readouterr().err
    save_routes(tmp_path / "a.rr", batch())
    save_routes(tmp_path / "b.safetensors", batch())
    (tmp_path / "notes.txt").write_text("not a record, not looked at")
    assert _cli.main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("OK") == 2
    (tmp_path / "b.safetensors").write_bytes(b"\0" * 20)
    assert _cli.main(["verify", str(tmp_path)]) == 1


def test_a_name_at_the_file_systems_limit_is_written_and_its_leftovers_cleaned(
    tmp_path: Path,
) -> None:
    """255 bytes is the most a name may have; its temporary file (about 30 bytes more) is named
    after a shortened stem, so the write goes through and a killed writer's leftover of that
    name is still told apart and removed."""
    name = "x" + "é" * 121 + ".safetensors"  # 1 + 242 + 12 = 255 bytes, multi-byte
    assert len(name.encode()) == 255
    stem = temp_stem(name)
    assert len(stem.encode()) <= NAME_BYTES
    assert stem != name
    dead = tmp_path / f".{stem}.{host_tag()}-{dead_pid()}.a1b2c3d4.tmp"
    dead.write_bytes(b"half a record")
    other = leftover(tmp_path, "other.rr", dead_pid())
    path = save_routes(tmp_path / name, batch())
    assert load_routes(path).equal(batch())
    assert not dead.exists()  # the next write to the same destination removed it
    assert other.exists()
    assert temp_stem("step.rr") == "step.rr"  # short names are kept whole
