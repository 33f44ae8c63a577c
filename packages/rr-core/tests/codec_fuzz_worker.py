"""Mutated payloads through every codec decoder, run by test_codec_fuzz.py in a child process (a
compiled kernel reading past a buffer would kill the process, not raise): bit flips, truncation,
extension, and the fields a record's header gives (row count, validity mask, offsets, meta)
set huge, negative or off by one. Every decode ends in an RRError or routes that are what the
payload can hold (ids in [0, E), the batch's shape), and decode_routes_into writes no row but
the caller's. Prints ``ok <cases>``; any other exception fails the child."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys

import torch

from rr_core import RouteBatch, RouteMeta, RRError, kernels
from rr_core.codecs.encoding import CODECS, decode_routes, decode_routes_into, encode_routes

GUARD = 99  # the value of every row decode_routes_into must leave alone


def batches() -> list[RouteBatch]:
    out = []
    for e, k in ((8, 2), (128, 8), (300, 4)):
        meta = RouteMeta(num_experts=e, top_k=k, layer_axis="moe_layers", layer_numbers=(1, 2))
        gen = torch.Generator().manual_seed(e)
        n = 13
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n * 2)])
        values = ids.reshape(n, 2, k).to(torch.uint8 if e <= 256 else torch.int16)
        valid = torch.ones(n, dtype=torch.bool)
        valid[[3, 7]] = False
        values[~valid] = 0
        out.append(RouteBatch(values, torch.tensor([0, 5, 13]), valid, meta))
    return out


def mutations(encoded, rng: random.Random):  # type: ignore[no-untyped-def]
    p = encoded.payload
    n = p.numel()
    flipped = p.clone()
    for _ in range(rng.randint(1, 4)):
        if n:
            flipped[rng.randrange(n)] ^= 1 << rng.randrange(8)
    yield "bit flips", dataclasses.replace(encoded, payload=flipped)
    yield "truncated", dataclasses.replace(encoded, payload=p[: rng.randrange(max(n, 1))])
    extra = torch.randint(0, 256, (rng.randint(1, 9),), dtype=torch.uint8)
    yield "extended", dataclasses.replace(encoded, payload=torch.cat([p, extra]))
    for rows in (-1, -(2**40), encoded.num_rows + 1, encoded.num_rows - 1, 2**40, 2**62):
        yield f"num_rows={rows}", dataclasses.replace(encoded, num_rows=rows)
    bits = encoded.valid_bits.clone()
    bits[rng.randrange(bits.numel())] ^= 1 << rng.randrange(8)
    yield "valid bit flipped", dataclasses.replace(encoded, valid_bits=bits)
    yield "valid bits cut", dataclasses.replace(encoded, valid_bits=bits[:-1])
    for offsets in ([0, 5, 2**40], [0, -5, 13], [0, 13, 5], [-1, 13]):
        yield f"offsets {offsets}", dataclasses.replace(encoded, offsets_B1=torch.tensor(offsets))
    m = encoded.meta
    for e in (m.num_experts - 1, m.num_experts + 1, 2, 2**31):
        if e > m.top_k:
            meta = dataclasses.replace(m, num_experts=e)
            yield f"num_experts={e}", dataclasses.replace(encoded, meta=meta)


def check(batch: RouteBatch, meta: RouteMeta) -> None:
    v = batch.values_NLK.long()
    assert v.dim() == 3
    assert v.shape[1:] == (len(meta.layer_numbers), meta.top_k)
    if v.numel():
        assert int(v.min()) >= 0
        assert int(v.max()) < meta.num_experts


def into(encoded, batch_rows: int):  # type: ignore[no-untyped-def]
    """decode_routes_into a buffer with guard rows around the caller's rows."""
    meta = encoded.meta
    out = torch.full(
        (batch_rows + 4, len(meta.layer_numbers), meta.top_k), GUARD, dtype=torch.int32
    )
    inner = out[2 : 2 + batch_rows]
    with contextlib.suppress(RRError):
        decode_routes_into(encoded, inner)
    assert (out[:2] == GUARD).all(), "a write before the caller's rows"
    assert (out[-2:] == GUARD).all(), "a write after the caller's rows"


def main(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    cases = 0
    families = kernels.KERNELS if kernels.numba_available() else ("numpy",)
    for batch in batches():
        for codec in CODECS:
            encoded = encode_routes(batch, codec)
            exact = decode_routes(encoded)
            want = batch.values_NLK.long()
            want = want.sort(dim=-1).values if codec == "set" else want  # set: ids sorted
            assert torch.equal(exact.values_NLK.long(), want)
            for _ in range(rounds):
                for what, mutated in mutations(encoded, rng):
                    for kernel in families:
                        with kernels.use_kernel(kernel):
                            cases += 1
                            try:
                                got = decode_routes(mutated)
                            except RRError:
                                pass
                            except Exception as e:
                                raise AssertionError(f"{codec} {what} {kernel}: {e!r}") from e
                            else:
                                check(got, mutated.meta)
                            if mutated.num_rows == batch.num_tokens and mutated.meta == batch.meta:
                                into(mutated, batch.num_tokens)
    print(f"ok {cases}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
