"""Multi-rank records: one shard file per rank plus an index of the sample ids each shard holds.

Each rank calls :func:`write_shard` with the sequences it owns; once all ranks are done, one
process calls :func:`write_index`, which reads only the shard headers. :func:`load_samples`
then opens just the shards that hold the requested sample ids. The index records each shard's
checksum, so a shard rewritten after indexing is refused instead of silently mixed in.

Shape legend: N rows, B sequences, L layer slots, K top-k.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rr_core.checks import as_index, check_instance, check_sequence
from rr_core.codecs.encoding import DEFAULT_CODEC, EncodedRoutes
from rr_core.errors import RecordFileError
from rr_core.records.atomic import as_path, atomic_write
from rr_core.records.file import (
    PathLike,
    RecordHeader,
    SampleId,
    decode_record,
    producer_fields,
    read_header,
    read_record,
    save_routes,
)
from rr_core.routes.batch import RouteBatch
from rr_core.routes.id_dtypes import narrowest_dtype
from rr_core.routes.jagged import cat_rows

INDEX_NAME = "index.json"
INDEX_FORMAT = "rr-routes-index"
#: ``shard_path``'s names: five digits (zero-padded), or more for ranks from 100000 on.
_SHARD = re.compile(r"^routes-rank(\d{5}|[1-9]\d{5,})\.safetensors$")


def shard_path(directory: PathLike, rank: int) -> Path:
    """Where rank ``rank`` writes its shard in ``directory``."""
    rank = as_index(rank, "rank", RecordFileError)
    if rank < 0:
        raise RecordFileError(f"rank must be >= 0; got {rank}")
    return as_path(directory, "directory") / f"routes-rank{rank:05d}.safetensors"


def write_shard(
    directory: PathLike,
    rank: int,
    routes: RouteBatch,
    *,
    sample_ids: Sequence[SampleId],
    codec: str = DEFAULT_CODEC,
    producer: Mapping[str, str] | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> Path:
    """Write this rank's routes atomically; ``sample_ids`` must be unique across all ranks;
    ``provenance`` as :func:`~rr_core.save_routes` takes it."""
    rank = as_index(rank, "rank", RecordFileError)
    path = shard_path(directory, rank)  # the arguments checked before anything is created
    extra = {"rank": str(rank), **producer_fields(producer)}
    takes = "write_shard takes a RouteBatch"
    check_instance(routes, RouteBatch, RecordFileError, takes)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordFileError(
            f"{directory}: cannot create the shard directory ({exc.strerror or exc})"
        ) from exc
    return save_routes(
        path,
        routes,
        codec=codec,
        sample_ids=sample_ids,
        producer=extra,
        provenance=provenance,
    )


def write_index(directory: PathLike, *, world_size: int | None = None) -> Path:
    """Index every shard in ``directory`` (reading headers only) and write ``index.json``
    atomically. With ``world_size``, a missing rank raises instead of being left out."""
    d = as_path(directory, "directory")
    if world_size is not None:
        world_size = as_index(world_size, "world_size", RecordFileError)
    if not d.is_dir():
        raise RecordFileError(f"{d}: no such directory of shards")
    found = {int(m.group(1)): p for p in d.iterdir() if (m := _SHARD.match(p.name))}
    if world_size is not None:
        missing = sorted(set(range(world_size)) - set(found))
        if missing:
            raise RecordFileError(f"{d}: no shard for ranks {missing} of world size {world_size}")
    if not found:
        raise RecordFileError(f"{d}: no shard files (routes-rankNNNNN.safetensors)")
    owner: dict[SampleId, str] = {}
    shards: list[dict[str, Any]] = []
    first = None
    for rank in sorted(found):
        h = read_header(found[rank])
        if first is None:
            first = h
        elif (h.meta, h.codec) != (first.meta, first.codec):
            raise RecordFileError(
                f"{h.path}: {h.meta} with codec {h.codec!r} differs from {first.path}: "
                f"{first.meta} with codec {first.codec!r}; all shards of a run must agree"
            )
        for s in h.sample_ids:
            if s in owner:
                raise RecordFileError(f"sample id {s!r} is in both {owner[s]} and {h.path.name}")
            owner[s] = h.path.name
        shards.append(
            {"file": h.path.name, "rank": rank, "checksum": h.checksum, "sample_ids": h.sample_ids}
        )
    index = {"format": INDEX_FORMAT, "version": 1, "shards": shards}
    return atomic_write(d / INDEX_NAME, json.dumps(index, indent=1).encode())


class RouteIndex:
    """A parsed ``index.json``: which shard holds which sample id."""

    def __init__(self, path: PathLike) -> None:
        self.path = as_path(path)
        try:
            raw = json.loads(self.path.read_bytes())
        except OSError as exc:
            raise RecordFileError(f"{self.path}: cannot read ({exc.strerror})") from exc
        except ValueError as exc:
            raise RecordFileError(f"{self.path}: corrupt index ({exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
            raise RecordFileError(f"{self.path}: not an rr route index")
        self.shards: list[dict[str, Any]] = _check_shards(self.path, raw.get("shards"))
        self.owner: dict[SampleId, int] = {
            s: i for i, shard in enumerate(self.shards) for s in shard["sample_ids"]
        }

    @property
    def sample_ids(self) -> list[SampleId]:
        return [s for shard in self.shards for s in shard["sample_ids"]]

    def shard_files(self) -> list[Path]:
        return [self.path.parent / shard["file"] for shard in self.shards]

    def load(
        self, sample_ids: Sequence[SampleId], *, device: torch.device | str | None = None
    ) -> RouteBatch:
        """The routes of ``sample_ids``, in that order, reading only the shards that hold them.
        No ids give an empty batch (zero sequences) with the run's meta."""
        wanted = _requested(sample_ids)
        missing = [s for s in wanted if s not in self.owner]
        if missing:
            raise RecordFileError(f"{self.path}: sample ids {missing[:10]} are in no shard")
        if not wanted:
            return self._empty(device)
        needed = sorted({self.owner[s] for s in wanted})
        parts: list[RouteBatch] = []
        position: dict[SampleId, int] = {}
        for i in needed:
            header, enc = self._read(i)
            batch = decode_record(header.path, enc, device)
            base = sum(p.num_sequences for p in parts)
            position.update({s: base + j for j, s in enumerate(header.sample_ids)})
            parts.append(batch)
        return take_sequences(concat_batches(parts), [position[s] for s in wanted])

    def _read(self, i: int) -> tuple[RecordHeader, EncodedRoutes]:
        """Shard ``i``, checked against what the index says it holds."""
        shard = self.shards[i]
        path = self.path.parent / shard["file"]
        header, enc = read_record(path)
        if header.checksum != shard["checksum"]:
            raise RecordFileError(
                f"{path}: changed after {self.path} was written (checksum differs); "
                "rewrite the index"
            )
        if header.sample_ids != tuple(shard["sample_ids"]):
            raise RecordFileError(
                f"{self.path}: lists sample ids {list(shard['sample_ids'])[:10]} for {path.name}, "
                f"which holds {list(header.sample_ids)[:10]}; rewrite the index"
            )
        return header, enc

    def _empty(self, device: torch.device | str | None) -> RouteBatch:
        if not self.shards:
            raise RecordFileError(f"{self.path}: indexes no shard, so it has no meta to return")
        path = self.path.parent / self.shards[0]["file"]
        header = read_header(path)
        if header.checksum != self.shards[0]["checksum"]:
            raise RecordFileError(
                f"{path}: changed after {self.path} was written (checksum differs); "
                "rewrite the index"
            )
        meta = header.meta
        dev = torch.device("cpu") if device is None else torch.device(device)
        values = torch.zeros(
            (0, len(meta.layer_numbers), meta.top_k),
            dtype=narrowest_dtype(meta.num_experts),
            device=dev,
        )
        offsets = torch.zeros(1, dtype=torch.int64, device=dev)
        return RouteBatch(values, offsets, torch.zeros(0, dtype=torch.bool, device=dev), meta)


def _requested(sample_ids: Sequence[SampleId]) -> list[SampleId]:
    if isinstance(sample_ids, str | bytes) or not isinstance(sample_ids, Sequence):
        raise RecordFileError(
            f"sample_ids must be a list of ids; got {type(sample_ids).__name__} "
            f"{sample_ids!r:.60} (wrap a single id in a list)"
        )
    wanted = list(sample_ids)
    bad = [s for s in wanted if isinstance(s, bool) or not isinstance(s, int | str)]
    if bad:
        raise RecordFileError(f"sample ids are ints or strings; got {bad[:5]!r}")
    return wanted


def _check_shards(path: Path, shards: Any) -> list[dict[str, Any]]:
    """The index's shard entries, each a plain shard file name with its rank, checksum and
    unique sample ids; anything else is refused rather than read as another shard's routes."""
    if not isinstance(shards, list):
        raise RecordFileError(f"{path}: corrupt index (shards is {type(shards).__name__})")
    seen: dict[SampleId, str] = {}
    for shard in shards:
        name = shard.get("file") if isinstance(shard, dict) else None
        if not isinstance(name, str) or not _SHARD.match(name):
            raise RecordFileError(
                f"{path}: corrupt index: shard entry {shard!r:.80} names no shard file "
                "(routes-rankNNNNN.safetensors)"
            )
        ids = shard.get("sample_ids")
        if (
            not isinstance(shard.get("checksum"), str)
            or not isinstance(ids, list)
            or any(isinstance(s, bool) or not isinstance(s, int | str) for s in ids)
        ):
            raise RecordFileError(f"{path}: corrupt index: entry of {name} ({shard!r:.80})")
        for s in ids:
            if s in seen:
                raise RecordFileError(f"{path}: sample id {s!r} is in both {seen[s]} and {name}")
            seen[s] = name
    return shards


def load_samples(
    index_path: PathLike,
    sample_ids: Sequence[SampleId],
    *,
    device: torch.device | str | None = None,
) -> RouteBatch:
    """Routes of ``sample_ids`` from a sharded record (see :class:`RouteIndex`); an empty list
    gives an empty batch (zero sequences) with the run's meta."""
    return RouteIndex(index_path).load(sample_ids, device=device)


def concat_batches(batches: Sequence[RouteBatch]) -> RouteBatch:
    """The sequences of several batches with the same meta, in order."""
    if not batches:
        raise RecordFileError("nothing to concatenate")
    meta = batches[0].meta
    if any(b.meta != meta for b in batches):
        raise RecordFileError("batches to concatenate have different metas")
    if len(batches) == 1:
        return batches[0]
    ends = torch.tensor([0] + [b.num_tokens for b in batches[:-1]]).cumsum(0).tolist()
    offsets = [batches[0].offsets_B1[:1]] + [
        b.offsets_B1[1:] + e for b, e in zip(batches, ends, strict=True)
    ]
    return RouteBatch._trusted(
        cat_rows([b.values_NLK for b in batches]),
        torch.cat(offsets),
        cat_rows([b.valid_N for b in batches]),
        meta,
        all(b.ids_validated for b in batches),
    )


def take_sequences(batch: RouteBatch, indices: Sequence[int]) -> RouteBatch:
    """Sequences ``indices`` of ``batch`` as a new batch, gathered in one indexing operation."""
    check_instance(batch, RouteBatch, RecordFileError, "take_sequences takes a RouteBatch")
    picked = [
        as_index(i, "a sequence index", RecordFileError)
        for i in check_sequence(indices, "indices", RecordFileError)
    ]
    B = batch.num_sequences
    if any(not 0 <= i < B for i in picked):
        raise RecordFileError(
            f"take_sequences: indices {picked} outside 0..{B - 1} ({B} sequences)"
        )
    dev = batch.offsets_B1.device
    idx_B = torch.tensor(picked, dtype=torch.int64, device=dev)
    starts_B = batch.offsets_B1[idx_B]
    lengths_B = batch.offsets_B1[idx_B + 1] - starts_B
    offsets_B1 = torch.cat([lengths_B.new_zeros(1), lengths_B.cumsum(0)])
    N = int(offsets_B1[-1])
    seq_N = torch.repeat_interleave(torch.arange(len(picked), device=dev), lengths_B, output_size=N)
    rows_N = starts_B[seq_N] + torch.arange(N, device=dev) - offsets_B1[seq_N]
    return RouteBatch._trusted(
        batch.values_NLK[rows_N], offsets_B1, batch.valid_N[rows_N], batch.meta, batch.ids_validated
    )
