"""Record files whose checksum is valid but whose contents contradict themselves, as a buggy or
foreign writer would make them, and files that are not records at all: each is refused with a
RecordFileError naming the field, the value found and the value expected."""

from __future__ import annotations

import json
import pickle
import tracemalloc
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from rr_core.cli import main as _cli
from rr_core.errors import RecordFileError
from rr_core.records.file import _checksum, load_routes, read_header, read_record, save_routes
from rr_core.records.shards import load_samples, write_index, write_shard

from rr_core_testing import random_batch


def parts(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and tensors of a record file."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])["__metadata__"], load(data)


def rewrite(
    path: Path,
    out: Path,
    metadata: Mapping[str, str] | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """``path`` with some metadata values or tensors replaced and the checksum recomputed."""
    md, ts = parts(path)
    md.update(metadata or {})
    ts.update(tensors or {})
    md["checksum"] = _checksum(md, ts)
    out.write_bytes(save({k: t.contiguous() for k, t in ts.items()}, metadata=md))
    return out


@pytest.fixture
def record(tmp_path: Path) -> Path:
    batch = random_batch(np.random.default_rng(5), 60, 4, lengths=[6, 5], layers=3, dense=(2,))
    return save_routes(tmp_path / "good.rr", batch, sample_ids=["r0-a", "r0-b"])


def test_three_ids_for_two_sequences_are_refused_everywhere(
    record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = rewrite(record, tmp_path / "ids.rr", {"sample_ids": json.dumps(["r0-a", "r0-c", "x"])})
    for read in (load_routes, read_header, read_record):
        with pytest.raises(RecordFileError, match=r"ids\.rr: tensor offsets has 3 elements, "):
            read(bad)
    assert _cli.main(["verify", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("ids.rr") == 1
    assert "expected 4 (len(sample_ids)+1" in err
    # Indexed as shards: the index refuses the shard instead of serving another id's routes.
    run = tmp_path / "run"
    write_shard(run, 0, load_routes(record), sample_ids=["r0-a", "r0-b"])
    write_shard(run, 1, load_routes(record), sample_ids=["r1-a", "r1-b"])
    rewrite(
        run / "routes-rank00000.safetensors",
        run / "routes-rank00000.safetensors",
        {"sample_ids": json.dumps(["r0-a", "r0-b", "r0-c"])},
    )
    with pytest.raises(RecordFileError, match=r"routes-rank00000.*offsets has 3 elements"):
        write_index(run)


def test_a_hand_edited_index_cannot_map_an_id_to_another_sequence(tmp_path: Path) -> None:
    batch = random_batch(np.random.default_rng(1), 60, 4, lengths=[3, 4])
    write_shard(tmp_path, 0, batch, sample_ids=["a", "b"])
    index = write_index(tmp_path)
    raw = json.loads(index.read_text())
    raw["shards"][0]["sample_ids"] = ["a", "c"]
    index.write_text(json.dumps(raw))
    with pytest.raises(RecordFileError, match=r"lists sample ids \['a', 'c'\].*holds \['a', 'b'\]"):
        load_samples(index, ["c"])
    raw["shards"][0]["file"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(raw))
    with pytest.raises(RecordFileError, match="names no shard file"):
        load_samples(index, ["a"])


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int16, torch.bool, torch.float32, torch.bfloat16]
)
def test_a_payload_of_another_dtype_is_refused(
    record: Path, tmp_path: Path, dtype: torch.dtype, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ts = parts(record)
    bad = rewrite(record, tmp_path / "dtype.rr", tensors={"payload": ts["payload"].to(dtype)})
    with pytest.raises(RecordFileError, match=r"tensor payload has dtype '.+', expected U8"):
        load_routes(bad)
    assert _cli.main(["verify", str(bad)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert err.count("dtype.rr") == 1


def _bits(valid: list[bool]) -> torch.Tensor:
    padded = valid + [False] * (-len(valid) % 8)
    return torch.tensor(
        [sum(b << i for i, b in enumerate(padded[j : j + 8])) for j in range(0, len(padded), 8)],
        dtype=torch.uint8,
    )


def test_tensors_that_contradict_the_metadata_name_the_field(record: Path, tmp_path: Path) -> None:
    md, ts = parts(record)
    rows = int(md["num_rows"])
    bits = ts["valid_bits"]
    cases: list[tuple[dict[str, str], dict[str, torch.Tensor], str]] = [
        ({}, {"offsets": torch.tensor([0, 7, 5])}, "offsets runs from 0 to 5, expected 0 to"),
        ({}, {"offsets": torch.tensor([0, 12, 11])}, "offsets decreases at sequence 1"),
        ({}, {"offsets": torch.tensor([1, 5, 11])}, "offsets runs from 1"),
        ({}, {"offsets": torch.tensor([[0, 5, 11]])}, "offsets has shape"),
        ({}, {"offsets": torch.tensor([0, 5, 11], dtype=torch.int32)}, "offsets has dtype"),
        ({}, {"valid_bits": torch.cat([bits, bits[:1]])}, "valid_bits has 3 bytes, expected 2"),
        ({}, {"valid_bits": bits | torch.tensor([0, 0xF8], dtype=torch.uint8)}, "past num_rows"),
        ({}, {"valid_bits": _bits([True] * rows)}, r"payload has \d+ bytes, expected \d+ \(11"),
        ({}, {"payload": ts["payload"][:-1]}, "payload has"),
        ({}, {"extra": torch.zeros(1)}, "holds tensors"),
        ({"num_rows": "12"}, {}, "valid_bits has 2 bytes, expected 2|offsets runs"),
        ({"num_rows": "011"}, {}, "num_rows is '011', expected a decimal integer"),
        ({"num_experts": "6e1"}, {}, "num_experts is '6e1'"),
        ({"num_experts": "4294967296"}, {}, r"num_experts .* expected a decimal integer in"),
        ({"top_k": "61"}, {}, r"top_k is '61', expected a decimal integer in \[0, 60\]"),
        ({"top_k": "0"}, {}, "no valid layout: .*top_k"),
        ({"codec": "zip"}, {}, "codec is 'zip', expected one of raw, packed, set"),
        ({"layer_numbers": "[1, 2, true]"}, {}, "layer_numbers is .*expected a list of ints"),
        ({"layer_numbers": "[1, 2, 3.0]"}, {}, "layer_numbers is"),
        ({"layer_numbers": "[1, 2]"}, {}, "no valid layout"),
        ({"layer_numbers": json.dumps(list(range(1, 5000)))}, {}, "at most 4096 layers"),
        ({"moe_layer_numbers": "[1, 4]"}, {}, "no valid layout: .*subset"),
        ({"moe_layer_numbers": "[1, 2, 3]"}, {}, r"payload has \d+ bytes, expected \d+"),
        ({"layer_axis": "moe_layers"}, {}, "no valid layout: .*moe_layers axis"),
        ({"sample_ids": '["a", "a"]'}, {}, "sample_ids .*do not repeat"),
        ({"sample_ids": "[true, 2]"}, {}, "sample_ids .*ints or strings"),
        ({"sample_ids": "{"}, {}, "sample_ids is '{', expected JSON"),
        ({"producer": '{"engine": 3}'}, {}, "producer"),
        ({"rr.format_version": "3"}, {}, "format version '3'.*reads versions 1, 2.*upgrade"),
        ({"provenance": "[1]"}, {}, "provenance must be a mapping"),
        ({"provenance": "{"}, {}, "provenance is '{', expected a JSON object"),
        ({"provenance": '{"prefix_caching": "yes"}'}, {}, "'prefix_caching' is 'yes' .*bool"),
        ({"provenance": '{"engine": 3}'}, {}, "'engine' is 3 .*expected str"),
        ({"provenance": '{"extra": [1]}'}, {}, "'extra' is \\[1\\]"),
    ]
    for i, (metadata, tensors, match) in enumerate(cases):
        bad = rewrite(record, tmp_path / f"case{i}.rr", metadata, tensors)
        with pytest.raises(RecordFileError, match=rf"case{i}\.rr: .*(?:{match})"):
            load_routes(bad)
    md.pop("top_k")
    md["checksum"] = _checksum(md, ts)
    (tmp_path / "nokey.rr").write_bytes(save(ts, metadata=md))
    with pytest.raises(RecordFileError, match="top_k is None, expected present"):
        load_routes(tmp_path / "nokey.rr")


def test_files_that_are_not_records_say_so(tmp_path: Path) -> None:
    pickled = tmp_path / "routes.pt"
    pickled.write_bytes(pickle.dumps({"routes": list(range(100))}))
    noise = tmp_path / "noise.rr"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    plain = tmp_path / "plain.safetensors"
    plain.write_bytes(save({"x": torch.zeros(3)}))
    other = tmp_path / "other.safetensors"
    other.write_bytes(save({"x": torch.zeros(3)}, metadata={"format": "pt"}))
    torch.save({"a": torch.zeros(2)}, tmp_path / "zip.pt")
    for f in (pickled, noise, plain, other, tmp_path / "zip.pt"):
        for read in (load_routes, read_header):
            with pytest.raises(RecordFileError, match=rf"{f.name}: not an rr record file"):
                read(f)


def test_a_huge_declared_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.rr"
    with big.open("wb") as f:  # sparse: 900 MiB declared and present, nothing allocated on disk
        f.write((900 << 20).to_bytes(8, "little") + b"{")
        f.truncate(8 + (900 << 20))
    tracemalloc.start()
    try:
        for read in (load_routes, read_header):
            with pytest.raises(RecordFileError, match=r"not an rr record file .*at most 16 MiB"):
                read(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_writing_into_a_missing_directory_names_the_directory(
    record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = load_routes(record)
    missing = tmp_path / "no" / "such"
    with pytest.raises(RecordFileError, match=rf"{missing}: no such directory to write x\.rr"):
        save_routes(missing / "x.rr", batch)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecordFileError, match=r"file/run: cannot create the shard directory"):
        write_shard(blocker / "run", 0, batch, sample_ids=[1, 2])
    with pytest.raises(RecordFileError, match="no such directory of shards"):
        write_index(missing)
    assert _cli.main(["convert", str(record), str(missing / "x.rr"), "--codec", "raw"]) == 1
    err = capsys.readouterr().err
    assert f"{missing}: no such directory" in err
    assert ".tmp" not in err
    with pytest.raises(RecordFileError, match="producer must map strings to strings"):
        save_routes(tmp_path / "p.rr", batch, producer={"step": 3})  # type: ignore[dict-item]


def test_load_samples_of_no_ids_is_an_empty_batch(tmp_path: Path) -> None:
    batch = random_batch(np.random.default_rng(2), 300, 4, lengths=[3, 4], dense=(1,))
    write_shard(tmp_path, 0, batch, sample_ids=["a", "b"])
    index = write_index(tmp_path)
    empty = load_samples(index, [])
    assert empty.num_sequences == 0
    assert empty.num_tokens == 0
    assert empty.meta == batch.meta
    assert empty.values_NLK.dtype == batch.values_NLK.dtype
    assert empty.values_NLK.shape == (0, 3, 4)
    with pytest.raises(RecordFileError, match="sample_ids must be a list of ids; got str 'a'"):
        load_samples(index, "a")
    with pytest.raises(RecordFileError, match=r"ints or strings; got \[\[1\]\]"):
        load_samples(index, [[1]])  # type: ignore[list-item]
    got = load_samples(index, ["b", "b"])  # an id twice: its routes twice
    assert got.lengths.tolist() == [4, 4]


@pytest.mark.parametrize("codec", ["packed", "set"])
def test_payload_bits_past_the_last_field_are_refused(tmp_path: Path, codec: str) -> None:
    batch = random_batch(np.random.default_rng(4), 8, 1, lengths=[3], layers=1, valid_share=1.0)
    path = save_routes(tmp_path / "ok.rr", batch, codec=codec)  # 3 fields of 3 bits: 9 bits
    payload = parts(path)[1]["payload"].clone()
    payload[-1] |= 0x80
    bad = rewrite(path, tmp_path / "pad.rr", tensors={"payload": payload})
    with pytest.raises(RecordFileError, match=r"pad\.rr: tensor payload has bits set past"):
        load_routes(bad)


def test_an_allocation_that_fails_while_decoding_is_a_record_error(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rr_core.records.file as record_file

    def out_of_memory(*_: object, **__: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(record_file, "decode_routes", out_of_memory)
    with pytest.raises(RecordFileError, match=r"good\.rr: cannot decode 11 rows x 3 layer slots"):
        load_routes(record, device="cpu")


def test_version_1_files_still_read_with_no_provenance(record: Path, tmp_path: Path) -> None:
    md, ts = parts(record)
    assert md["rr.format_version"] == "2"
    assert json.loads(md["provenance"]) == {}
    md.pop("provenance")
    md["rr.format_version"] = "1"
    md["checksum"] = _checksum(md, ts)
    old = tmp_path / "v1.rr"
    old.write_bytes(save(ts, metadata=md))
    assert load_routes(old).equal(load_routes(record))
    assert read_header(old).provenance == {}
    # A version-2 file without its provenance is refused: the key belongs to the version.
    md["rr.format_version"] = "2"
    md["checksum"] = _checksum(md, ts)
    (tmp_path / "v2.rr").write_bytes(save(ts, metadata=md))
    with pytest.raises(RecordFileError, match="provenance is None, expected present"):
        read_header(tmp_path / "v2.rr")


def test_provenance_round_trips_and_bad_values_are_refused_at_write(tmp_path: Path) -> None:
    batch = random_batch(np.random.default_rng(2), 16, 2, lengths=[3], layers=2)
    given = {"engine": "vllm", "engine_version": "0.33.0", "prefix_caching": False}
    given |= {"speculative": None, "id_dtype": "uint8", "max_bytes": 96000000}
    path = save_routes(tmp_path / "p.rr", batch, provenance=given)
    assert read_header(path).provenance == given
    assert read_record(path)[0].provenance == given
    for bad, match in (
        ({"prefix_caching": 1}, "'prefix_caching' is 1 .*expected bool"),
        ({"engine_version": 0.33}, "'engine_version' is 0.33 .*expected str"),
        ({3: "x"}, "provenance key 3 is not a string"),
        ({"nested": {"a": 1}}, "'nested' is"),
    ):
        with pytest.raises(RecordFileError, match=match):
            save_routes(tmp_path / "bad.rr", batch, provenance=bad)  # type: ignore[dict-item]
        assert not (tmp_path / "bad.rr").exists()
    shard = write_shard(tmp_path / "shards", 0, batch, sample_ids=["s"], provenance=given)
    assert read_header(shard).provenance == given
