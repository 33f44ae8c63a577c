"""rr inspect, rr convert and rr verify on real files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rr_core.cli import main as _cli
from rr_core.records.file import load_routes, read_header, save_routes
from rr_core.records.shards import write_index, write_shard
from test_codecs import random_batch


@pytest.fixture
def record(tmp_path: Path) -> Path:
    batch = random_batch(np.random.default_rng(3), 128, 8, lengths=[20, 12], layers=4, dense=(1,))
    return save_routes(tmp_path / "run.rr", batch, sample_ids=["p", "q"])


def test_inspect_text_and_json(record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["inspect", str(record)]) == 0
    out = capsys.readouterr().out
    assert "codec packed, E=128, top-k=8" in out
    assert "raw 24, packed 21, set 15.375" in out
    assert len([line for line in out.splitlines() if "|" in line]) == 3  # one per MoE layer
    assert _cli.main(["inspect", "--json", str(record)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["moe_layer_numbers"] == [2, 3, 4]
    assert np.array(info["expert_load"]).shape == (3, 128)
    assert sum(map(sum, info["expert_load"])) == info["valid_rows"] * 3 * 8


def test_inspect_plot(record: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "load.png"
    assert _cli.main(["inspect", str(record), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_convert_to_every_codec_and_back(
    record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = load_routes(record)
    for codec in ("raw", "set", "packed"):
        out = tmp_path / f"{codec}.rr"
        args = ["convert", str(record), str(out), "--codec", codec, "--chunk-rows", "8"]
        assert _cli.main([*args, "--progress"]) == 0
        assert "convert" in capsys.readouterr().err  # the progress bar
        got = load_routes(out)
        expected = original.values_NLK.sort(-1).values if codec == "set" else original.values_NLK
        assert torch.equal(got.values_NLK, expected)
        assert read_header(out).sample_ids == ("p", "q")
    assert _cli.main(["convert", str(record), str(tmp_path / "x.rr"), "--codec", "zip"]) == 1


def test_verify_exit_codes(
    record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli.main(["verify", str(record)]) == 0
    data = bytearray(record.read_bytes())
    data[-1] ^= 0x10
    bad = tmp_path / "bad.rr"
    bad.write_bytes(data)
    assert _cli.main(["verify", str(bad)]) == 1
    assert "bad.rr" in capsys.readouterr().err
    shards = tmp_path / "shards"
    for r in range(2):
        batch = random_batch(np.random.default_rng(r), 60, 2, lengths=[5, 5])
        write_shard(shards, r, batch, sample_ids=[2 * r, 2 * r + 1])
    index = write_index(shards)
    assert _cli.main(["verify", str(index)]) == 0
    (shards / "routes-rank00001.safetensors").write_bytes(b"\0" * 16)
    assert _cli.main(["verify", str(index)]) == 1
