"""save_routes never writes what its reader refuses: a header over the reader's limit
(a 20 MB provenance value, hundreds of thousands of sequences named by uuid) and provenance
holding NaN or Infinity are refused at write time; a shard of rank >= 100000 is indexed."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest
import torch

from rr_core import RecordFileError, RouteBatch, RouteMeta, load_routes, save_routes
from rr_core.records.file import MAX_HEADER_BYTES
from rr_core.records.shards import load_samples, shard_path, write_index, write_shard

META = RouteMeta(num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1,))


def one_token_sequences(count: int) -> RouteBatch:
    values = torch.tensor([0, 1], dtype=torch.uint8).repeat(count, 1, 1)
    offsets = torch.arange(count + 1, dtype=torch.int64)
    return RouteBatch(values, offsets, torch.ones(count, dtype=torch.bool), META)


def test_a_provenance_over_the_header_limit_is_refused_at_write_time(tmp_path: Path) -> None:
    path = tmp_path / "r.rr"
    big = {"engine": "vllm", "notes": "x" * 20_000_000}
    with pytest.raises(RecordFileError, match=r"header would be \d+ bytes.*provenance"):
        save_routes(path, one_token_sequences(2), provenance=big)
    assert not path.exists()


def test_sample_ids_over_the_header_limit_are_refused_at_write_time(tmp_path: Path) -> None:
    count = MAX_HEADER_BYTES // 38 + 1  # a uuid is 36 characters, 40 bytes in a JSON list
    ids = [str(uuid.UUID(int=i)) for i in range(count)]
    with pytest.raises(RecordFileError, match=r"header would be.*sample_ids.*write_shard"):
        save_routes(tmp_path / "r.rr", one_token_sequences(count), sample_ids=ids)
    # just under the limit is written and read back
    fits = MAX_HEADER_BYTES // 44 - 2000  # each id is escaped again in the header
    path = save_routes(tmp_path / "ok.rr", one_token_sequences(fits), sample_ids=ids[:fits])
    assert load_routes(path).num_sequences == fits


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_provenance_holding_nan_or_infinity_is_refused(tmp_path: Path, value: float) -> None:
    with pytest.raises(RecordFileError, match=r"provenance 'temperature' is .*no NaN or Infinity"):
        save_routes(tmp_path / "r.rr", one_token_sequences(1), provenance={"temperature": value})
    path = save_routes(tmp_path / "ok.rr", one_token_sequences(1), provenance={"temperature": 0.7})
    assert path.exists()


@pytest.mark.parametrize("rank", [99_999, 100_000, 1_234_567])
def test_a_shard_of_a_six_or_more_digit_rank_is_indexed(tmp_path: Path, rank: int) -> None:
    write_shard(tmp_path, 0, one_token_sequences(1), sample_ids=["a"])
    path = write_shard(tmp_path, rank, one_token_sequences(2), sample_ids=["b", "c"])
    assert path == shard_path(tmp_path, rank)
    index = json.loads(write_index(tmp_path).read_text())
    assert {s["rank"] for s in index["shards"]} == {0, rank}
    assert load_samples(tmp_path / "index.json", ["c"]).num_sequences == 1
