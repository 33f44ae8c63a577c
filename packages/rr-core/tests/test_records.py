"""Record files: round trips, truncations and bit flips in every region caught, kill-safe writes,
shards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rr_core import ReplayController, ReplayMode, RouteBatch
from rr_core.errors import RecordFileError
from rr_core.records.file import load_routes, read_header, read_record, save_routes
from rr_core.records.shards import (
    RouteIndex,
    load_samples,
    take_sequences,
    write_index,
    write_shard,
)

from rr_core_testing import TinyModel, random_batch


def small_batch(seed: int = 0) -> RouteBatch:
    return random_batch(np.random.default_rng(seed), 60, 4, lengths=[3, 2], layers=2)


def test_round_trip_keeps_routes_ids_and_versions(tmp_path: Path) -> None:
    batch = random_batch(np.random.default_rng(0), 384, 8, lengths=[9, 0, 5], dense=(2,))
    for codec in ("raw", "packed"):
        path = save_routes(
            tmp_path / f"{codec}.rr",
            batch,
            codec=codec,
            sample_ids=["a", 7, "c"],
            producer={"engine": "test 1.0"},
        )
        assert load_routes(path).equal(batch)
        header = read_header(path)
        assert header.sample_ids == ("a", 7, "c")
        assert header.codec == codec
        assert header.meta == batch.meta
        assert header.producer["engine"] == "test 1.0"
        assert "torch" in header.producer
    assert not list(tmp_path.glob(".*.tmp"))


def regions(data: bytes) -> dict[str, list[int]]:
    """The byte positions of a record file by what they hold: the header length, each metadata
    value and tensor entry of the JSON header, its padding, the JSON around them, and each
    tensor's bytes. Together they are every byte of the file, each once."""
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n].decode("ascii")
    header = json.loads(text)
    found = {
        "header length": list(range(8)),
        "header padding": list(range(8 + len(text.rstrip()), 8 + n)),
    }

    def value(key: str) -> list[int]:  # keys are unique and compact: '"key":value'
        start = text.index(f'"{key}":') + len(key) + 3
        end = json.JSONDecoder().raw_decode(text, start)[1]
        return list(range(8 + start, 8 + end))

    for key in header.pop("__metadata__"):
        found[f"metadata {key}"] = value(key)
    for name, entry in header.items():
        found[f"{name} entry"] = value(name)
        low, high = entry["data_offsets"]
        found[f"{name} bytes"] = list(range(8 + n + low, 8 + n + high))
    taken = {i for positions in found.values() for i in positions}
    found["header JSON"] = [i for i in range(8, 8 + n) if i not in taken]
    assert sorted(i for positions in found.values() for i in positions) == list(range(len(data)))
    return found


def samples(data: bytes) -> list[int]:
    """Byte positions to corrupt: the first, middle and last byte of every region (and so the
    file's first and last bytes). Each region reaches its own check (length prefix, JSON,
    metadata parsing, safetensors layout, checksum), so a sample per region covers every way a
    damaged file is refused at a tenth of the cost of every position."""
    picked = {r[i] for r in regions(data).values() if r for i in (0, len(r) // 2, -1)}
    return sorted(picked)


def test_a_truncation_in_any_region_raises_naming_the_file(tmp_path: Path) -> None:
    path = save_routes(tmp_path / "r.rr", small_batch())
    data = path.read_bytes()
    cut = tmp_path / "cut.rr"
    sizes = {*range(9), *samples(data), *(i + 1 for i in samples(data) if i + 1 < len(data))}
    for size in sorted(sizes):  # inside the length prefix, then just before and into each region
        cut.write_bytes(data[:size])
        with pytest.raises(RecordFileError, match=r"cut\.rr"):
            read_record(cut)


def test_a_bit_flip_in_any_region_is_detected(tmp_path: Path) -> None:
    path = save_routes(tmp_path / "r.rr", small_batch(), codec="packed")
    data = path.read_bytes()
    bad = tmp_path / "flip.rr"
    assert {0, len(data) - 1} <= set(samples(data))
    for byte in samples(data):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[byte] ^= 1 << bit
            bad.write_bytes(flipped)
            with pytest.raises(RecordFileError, match=r"flip\.rr"):
                load_routes(bad)


# The writer kills itself with SIGKILL at a named step of the atomic write: deterministic, and a
# real process death (no cleanup handlers run), exactly like the OOM killer or a node failure.
_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from rr_core.records import atomic as _atomic
    from rr_core.records.file import save_routes
    from rr_core_testing import random_batch

    path, point = sys.argv[1], sys.argv[2]
    _atomic.CHUNK_BYTES = 64  # several writes, so one can be cut in the middle
    real_write, real_replace = os.write, os.replace
    writes = []

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    def write(fd, data):
        writes.append(1)
        if point == "mid_write" and len(writes) == 3:
            real_write(fd, bytes(data)[:17])
            die()
        return real_write(fd, data)

    def replace(src, dst):
        if point == "before_rename":
            die()
        real_replace(src, dst)
        if point == "after_rename":
            die()

    if point == "before_write":
        os.write = die
    else:
        os.write = write
    if point == "before_fsync":
        os.fsync = die
    os.replace = replace
    save_routes(path, random_batch(np.random.default_rng(1), 60, 4, lengths=[40, 30], layers=2))
    print("survived")
    """
)


@pytest.mark.parametrize(
    "point", ["before_write", "mid_write", "before_fsync", "before_rename", "after_rename"]
)
def test_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path, point: str) -> None:
    path = tmp_path / "step.rr"
    old = small_batch()
    save_routes(path, old)
    tests = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path), point],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": tests, "PATH": ""},
        timeout=120,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    now = load_routes(path)  # whole and verified: old or new, never torn
    leftovers = list(tmp_path.glob(".step.rr.*.tmp"))
    assert len(leftovers) == (point != "after_rename")  # the writer did get to its temp file
    if point == "after_rename":
        new = random_batch(np.random.default_rng(1), 60, 4, lengths=[40, 30], layers=2)
        assert now.equal(new)
    else:
        assert now.equal(old)


def test_shards_index_and_read_by_sample_id(tmp_path: Path) -> None:
    ranks = [random_batch(np.random.default_rng(r), 128, 8, lengths=[4, 6, 5]) for r in range(3)]
    ids = [[f"s{r}-{i}" for i in range(3)] for r in range(3)]
    for r, (batch, names) in enumerate(zip(ranks, ids, strict=True)):
        write_shard(tmp_path, r, batch, sample_ids=names, codec="set" if r == 1 else "packed")
    with pytest.raises(RecordFileError, match="codec"):
        write_index(tmp_path)
    write_shard(tmp_path, 1, ranks[1], sample_ids=ids[1])
    with pytest.raises(RecordFileError, match=r"ranks \[3\]"):
        write_index(tmp_path, world_size=4)
    index_path = write_index(tmp_path, world_size=3)
    (tmp_path / "routes-rank00001.safetensors").write_bytes(b"not needed, not read")
    got = load_samples(index_path, ["s2-1", "s0-2", "s0-0"])
    assert got.equal(
        RouteBatch(
            torch.cat(
                [
                    take_sequences(ranks[2], [1]).values_NLK,
                    take_sequences(ranks[0], [2, 0]).values_NLK,
                ]
            ),
            torch.tensor([0, 6, 11, 15]),
            torch.cat(
                [take_sequences(ranks[2], [1]).valid_N, take_sequences(ranks[0], [2, 0]).valid_N]
            ),
            ranks[0].meta,
            allow_all_zero=True,
        )
    )
    with pytest.raises(RecordFileError, match="routes-rank00001"):
        load_samples(index_path, ["s1-0"])
    write_shard(tmp_path, 0, ranks[0], sample_ids=ids[0], producer={"rewritten": "yes"})
    with pytest.raises(RecordFileError, match="changed after"):
        RouteIndex(index_path).load(["s0-1"])
    with pytest.raises(RecordFileError, match="in no shard"):
        RouteIndex(index_path).load(["nope"])


def test_duplicate_sample_ids_across_shards_are_refused(tmp_path: Path) -> None:
    write_shard(tmp_path, 0, small_batch(0), sample_ids=[1, 2])
    write_shard(tmp_path, 1, small_batch(1), sample_ids=[2, 3])
    with pytest.raises(RecordFileError, match="sample id 2"):
        write_index(tmp_path)


def test_r2_step_recorded_to_disk_replays_bit_exactly(tmp_path: Path) -> None:
    """Record an old-policy forward, write it, perturb the router, replay from the file."""
    model = TinyModel(num_layers=3, num_experts=6, top_k=2)
    controller = ReplayController(num_experts=6, top_k=2)
    layers = controller.attach(model)
    try:
        x_TH = torch.randn(7, 8)
        controller.set_mode(ReplayMode.RECORD)
        with torch.no_grad():
            model(x_TH)
        recorded_TLK = controller.recorded()
        controller.end_step()
        from rr_core import RouteMeta

        meta = RouteMeta(num_experts=6, top_k=2, layer_axis="moe_layers", layer_numbers=layers)
        path = save_routes(tmp_path / "step.rr", RouteBatch(recorded_TLK, [0, 7], None, meta))
        with torch.no_grad():
            for layer in model.moe_layers():
                assert layer.router is not None
                layer.router.weight.add_(torch.randn_like(layer.router.weight))
        replay = load_routes(path)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm_batch(0, replay)
        with controller.microbatch(0):
            model(x_TH)
        assert torch.equal(model.routed_ids(), recorded_TLK.to(torch.int64))
        controller.end_step()
    finally:
        controller.detach()
