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

from rr_core_testing import random_batch


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


def test_inspect_json_is_compact(record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["inspect", "--json", str(record)]) == 0
    text = capsys.readouterr().out
    info = json.loads(text)
    lines = text.splitlines()
    assert len(lines) == len(info) + 3 + len(info["expert_load"])  # a key a line, a layer a line
    assert [line.strip().rstrip(",") for line in lines if line.startswith("  [")] == [
        json.dumps(row) for row in info["expert_load"]
    ]


def test_inspect_plot_checks_its_path_first_and_prints_before_drawing(
    record: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    missing = tmp_path / "missing" / "x.png"
    assert _cli.main(["inspect", str(tmp_path / "absent.rr"), "--plot", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"no such directory {missing.parent}" in err
    assert "absent.rr" not in err
    figures = []
    real_close = plt.close

    def keep(fig: object) -> None:
        figures.append(fig)
        real_close(fig)

    def first_the_figures(*args: object, **kwargs: object) -> None:
        assert "codec packed" in capsys.readouterr().out  # already on screen
        real_savefig(*args, **kwargs)

    monkeypatch.setattr(plt, "close", keep)
    from matplotlib.figure import Figure

    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", first_the_figures)
    out = tmp_path / "load.png"
    assert _cli.main(["inspect", str(record), "--plot", str(out)]) == 0
    (fig,) = figures
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["2", "3", "4"]  # layer numbers
    fig.canvas.draw()
    label = ax.yaxis.label.get_window_extent()
    assert label.x0 >= 0
    assert label.y0 >= 0
    assert label.y1 <= fig.bbox.height


@pytest.mark.parametrize("rows", ["0", "-5", "many"])
def test_convert_chunk_rows_must_be_positive(
    record: Path, tmp_path: Path, rows: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["convert", str(record), str(tmp_path / "x.rr"), "--codec", "raw", "--chunk-rows", rows]
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(args)
    assert exit_info.value.code == 2
    assert "--chunk-rows: expected a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "x.rr").exists()


def test_verify_names_the_file_once(record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(record.read_bytes())
    data[-1] ^= 1
    record.write_bytes(data)
    assert _cli.main(["verify", str(record)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"FAIL {record}: checksum mismatch")
    assert line.count("run.rr") == 1


PROVENANCE = {
    "engine": "sglang",
    "engine_version": "0.5.23",
    "routing_precision": "float32",
    "speculative": "none",
    "prefix_caching": True,
    "id_dtype": "int32",
}


def test_inspect_shows_provenance_and_convert_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = random_batch(np.random.default_rng(4), 64, 4, lengths=[5, 3], layers=2)
    path = save_routes(tmp_path / "sg.rr", batch, provenance=PROVENANCE)
    assert _cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("provenance"))
    assert 'engine "sglang"' in line
    assert 'engine_version "0.5.23"' in line
    assert "prefix_caching true" in line
    assert 'speculative "none"' in line
    assert _cli.main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"] == PROVENANCE
    converted = tmp_path / "sg-raw.rr"
    assert _cli.main(["convert", str(path), str(converted), "--codec", "raw"]) == 0
    assert read_header(converted).provenance == PROVENANCE


def test_inspect_of_a_file_without_provenance_says_so(
    record: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli.main(["inspect", str(record)]) == 0
    assert "provenance not recorded" in capsys.readouterr().out
