"""Property sweep over rr_megatron_compat's data-facing entry points: every call on generated
input, valid or not, returns a result that passes the entry point's own invariant (round trips
exact, rows where the layout puts them) or raises an RRError subclass, never a bare
IndexError/RuntimeError/KeyError/TypeError from inside, never a silently wrong answer.

Entry points covered:

- layout: ``parse_moe_layer_freq``, ``rank_moe_layer_numbers``
- pipeline: ``stack_rank_routes``, ``split_rank_routes``, ``merge_stage_routes``
- tokens: ``batch_to_router_rows``, ``router_rows_to_batch``, ``sp_alignment``, ``sp_pad``,
  ``cp_chunk_ids``, ``cp_split``, ``cp_merge``, ``thd_pack``, ``thd_unpack``, ``thd_cp_index``
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import example, given
from hypothesis import strategies as st

import rr_megatron_compat as rmc
from rr_core import LayoutConfig, stage_moe_layer_numbers
from rr_fakes.pytest_support import settles
from rr_fakes.sweeps import ANYTHING, JUNK, SWEEP, adapter_refuses, public_api_tests, tensors

INTS = st.one_of(st.integers(-2, 6), JUNK)


def ids(rows: int, layers: int = 2, k: int = 2) -> torch.Tensor:
    return torch.arange(rows * layers * k, dtype=torch.int16).reshape(rows, layers, k)


@SWEEP
@given(
    freq=st.one_of(
        st.integers(-1, 5),
        st.lists(st.integers(-1, 2), max_size=6),
        st.sampled_from(["4", "[1,0]*2", "[0]*3+[1]*1", "[1,", "eval('1')", "[2]*4", ""]),
        JUNK,
    ),
    num_layers=INTS,
)
def test_parse_moe_layer_freq(freq: Any, num_layers: Any) -> None:
    ok, out = settles(rmc.parse_moe_layer_freq, freq, num_layers)
    if ok:
        if isinstance(out, int):
            assert out >= 1
        else:
            assert len(out) == num_layers
            assert set(out) <= {0, 1}


@st.composite
def layouts(draw: st.DrawFn) -> LayoutConfig:
    pp = draw(st.integers(1, 3))
    vp = draw(st.sampled_from([None, 2])) if pp > 1 else None
    chunks = pp * (vp or 1)
    num_layers = chunks * draw(st.integers(1, 2))
    freq = draw(st.lists(st.integers(0, 1), min_size=num_layers, max_size=num_layers))
    freq[0] = 1
    return LayoutConfig(num_layers=num_layers, moe_layer_freq=freq, pp_size=pp, vp_size=vp)


@SWEEP
@given(cfg=layouts(), rank=INTS, T=st.integers(0, 3), drop=st.booleans())
def test_pipeline_round_trip(cfg: LayoutConfig, rank: Any, T: int, drop: bool) -> None:
    ok, numbers = settles(rmc.rank_moe_layer_numbers, cfg, rank)
    if not ok:
        return
    records = {n: torch.full((T, 2), n, dtype=torch.int64) for n in numbers}
    if drop and records:
        records.pop(numbers[0])
    ok, stacked = settles(rmc.stack_rank_routes, records, cfg, rank)
    if not ok:
        assert drop
        return
    if stacked is None:
        assert not numbers
        return
    assert stacked.shape == (T, len(numbers), 2)
    blocks = rmc.split_rank_routes(stacked, cfg, rank)
    for (pp, vp), block in blocks.items():
        want = stage_moe_layer_numbers(cfg, pp, vp)
        assert block.shape[1] == len(want)
        assert all(bool((block[:, j] == n).all()) for j, n in enumerate(want))
    settles(rmc.split_rank_routes, stacked[:, :-1], cfg, rank)
    settles(rmc.merge_stage_routes, blocks, cfg)  # one rank's blocks: refused or placed


@SWEEP
@given(cfg=layouts(), T=st.integers(0, 3), mutate=st.sampled_from(["none", "drop", "junk", "wide"]))
def test_merge_stage_routes(cfg: LayoutConfig, T: int, mutate: str) -> None:
    blocks: dict[Any, Any] = {}
    for pp in range(cfg.pp_size):
        for vp in range(cfg.vp_size) if cfg.vp_size else [None]:
            numbers = stage_moe_layer_numbers(cfg, pp, vp)
            if numbers:
                blocks[(pp, vp)] = torch.tensor(numbers).repeat(T, 1)[..., None].expand(-1, -1, 2)
    if mutate == "drop":
        blocks.pop(next(iter(blocks)))
    elif mutate == "junk":
        blocks[next(iter(blocks))] = None
    elif mutate == "wide":
        key = next(iter(blocks))
        blocks[key] = torch.cat([blocks[key], blocks[key][:, :1]], dim=1)
    ok, merged = settles(rmc.merge_stage_routes, blocks, cfg)
    if ok:
        assert mutate == "none"
        moe = [n for n in range(1, cfg.num_layers + 1) if cfg.moe_layer_freq[n - 1]]
        assert merged.shape == (T, len(moe), 2)
        for j, n in enumerate(moe):
            assert bool((merged[:, j] == n).all())
    else:
        assert mutate != "none"


@SWEEP
@given(routes=st.one_of(tensors(max_dims=5), JUNK), batch_size=INTS)
def test_router_rows(routes: Any, batch_size: Any) -> None:
    ok, rows = settles(rmc.batch_to_router_rows, routes)
    if ok:
        B, S = routes.shape[:2]
        assert rows.shape == (S * B, *routes.shape[2:])
        assert torch.equal(rmc.router_rows_to_batch(rows, B), routes) if B else True
    ok, back = settles(rmc.router_rows_to_batch, routes, batch_size)
    if ok:
        assert back.shape[0] == batch_size
        assert torch.equal(rmc.batch_to_router_rows(back), routes)


@SWEEP
@given(
    rows=st.integers(0, 9),
    tp=INTS,
    cp=INTS,
    mask=st.one_of(st.none(), JUNK, tensors(max_dims=2)),
)
def test_sp_pad(rows: int, tp: Any, cp: Any, mask: Any) -> None:
    routes = ids(rows)
    ok, align = settles(rmc.sp_alignment, tp, cp)
    if ok:
        assert align >= 1
    the_mask = torch.ones(rows, dtype=torch.bool) if mask is None else mask
    ok, out = settles(rmc.sp_pad, routes, the_mask, tp, cp)
    if ok:
        padded, padded_mask = out
        assert padded.shape[0] % align == 0
        assert padded.shape[0] - rows < align
        assert torch.equal(padded[:rows], routes)
        assert not padded_mask[rows:].any()


@SWEEP
@given(
    rows=st.integers(0, 12),
    cp_size=INTS,
    cp_rank=INTS,
    layout=st.one_of(st.sampled_from(["zigzag", "contiguous", "striped", "other"]), JUNK),
)
def test_cp_split_merge(rows: int, cp_size: Any, cp_rank: Any, layout: Any) -> None:
    seq = ids(rows)
    ok, chunks = settles(rmc.cp_chunk_ids, cp_rank, cp_size, layout)
    if ok:
        assert len(set(chunks)) == len(chunks)
    ok, part = settles(rmc.cp_split, seq, cp_rank, cp_size, layout=layout)
    if not ok:
        return
    parts = [rmc.cp_split(seq, r, cp_size, layout=layout) for r in range(cp_size)]
    assert torch.equal(parts[cp_rank], part)
    assert torch.equal(rmc.cp_merge(parts, layout=layout), seq)
    if len(parts) > 1:
        settles(rmc.cp_merge, [*parts[:-1], parts[-1][:-1]], layout=layout)


@SWEEP
@given(
    lengths=st.lists(st.integers(0, 5), max_size=3),
    align=INTS,
    masks=st.sampled_from(["none", "ok", "short", "junk"]),
    extra=st.one_of(st.none(), JUNK, tensors(max_dims=3)),
)
# An empty sequence next to routes of another [L, K]: once a bare torch.cat error.
@example(lengths=[0], align=1, masks="none", extra=torch.zeros(0, 0, 0, dtype=torch.int16))
def test_thd_pack(lengths: list[int], align: Any, masks: str, extra: Any) -> None:
    seqs: list[Any] = [ids(n) + i for i, n in enumerate(lengths)]
    if extra is not None:
        seqs.append(extra)
    mask_list: Any = {
        "none": None,
        "ok": [
            torch.ones(
                s.shape[0] if isinstance(s, torch.Tensor) and s.dim() else 0, dtype=torch.bool
            )
            for s in seqs
        ],
        "short": [torch.ones(1, dtype=torch.bool)] * len(seqs),
        "junk": [None] * len(seqs),
    }[masks]
    ok, packed = settles(rmc.thd_pack, seqs, mask_list, align=align)
    if not ok:
        return
    back = rmc.thd_unpack(packed)
    assert len(back) == len(seqs)
    for got, want in zip(back, seqs, strict=True):
        assert torch.equal(got.to(torch.int64), want.to(torch.int64))
    assert packed.rows_TLK.shape[0] % align == 0 or not seqs
    cu = packed.cu_seqlens_padded if hasattr(packed, "cu_seqlens_padded") else None
    if cu is not None:
        for cp_size in (1, 2):
            settles(rmc.thd_cp_index, cu, 0, cp_size)
    settles(rmc.thd_unpack, extra)


@SWEEP
@given(
    controller=st.one_of(st.just("real"), JUNK),
    model=st.sampled_from(["empty", "list", "none", "str", "junk_list"]),
    capacity=st.one_of(st.sampled_from(["warn", "raise", "ignore", "bogus"]), JUNK),
    stats=st.one_of(st.booleans(), JUNK),
    force=st.one_of(st.booleans(), JUNK),
)
def test_attach_arguments(
    controller: Any, model: str, capacity: Any, stats: Any, force: Any
) -> None:
    """attach / detach / install of wrong arguments raise RRErrors (Megatron itself not needed:
    a model without routers is refused by the walk)."""
    from torch import nn

    from rr_core import ReplayController

    ctrl = ReplayController(num_experts=4, top_k=2) if controller == "real" else controller
    the_model: Any = {
        "empty": nn.Sequential(nn.Linear(2, 2)),
        "list": [nn.Linear(2, 2)],
        "none": None,
        "str": "model",
        "junk_list": [None, 3],
    }[model]
    adapter_refuses(
        rmc, ctrl, the_model, force, capacity=capacity, ignore_unreplayed_in_stats=stats
    )


#: The entry points the sweeps above drive with generated layouts and routes, checking their
#: invariant.
SWEPT_ABOVE = (
    "parse_moe_layer_freq", "rank_moe_layer_numbers", "stack_rank_routes", "split_rank_routes",
    "merge_stage_routes", "batch_to_router_rows", "router_rows_to_batch", "sp_alignment",
    "sp_pad", "cp_chunk_ids", "cp_split", "cp_merge", "thd_pack", "thd_unpack", "thd_cp_index",
)  # fmt: skip
#: Entry points whose invariant on arguments of any kind is "a result or an rr error" (the
#: collectives without a process group here: each must refuse, never hang).
SWEPT_WITH_JUNK = (
    "MegatronLine", "PackedRoutes", "all_gather_exact", "check_replay_config",
    "count_routed_tokens", "cp_gather", "current_pipeline_rank", "enable_replay", "hook_specs",
    "installed_hooks", "layout_config", "line_flags", "megatron_line", "packed_seq_params",
    "pp_gather", "replay_config_fields", "replay_enabled", "replay_forward_step", "sp_gather",
    "sp_scatter",
)  # fmt: skip
#: Public names that take no outside data, or whose checks another test sweeps.
NOT_SWEPT_HERE = {
    **dict.fromkeys(
        ("ADAPTER", "MegatronAdapter", "install", "uninstall", "is_installed", "attach", "detach"),
        "the adapter protocol (tests/test_adapter_protocol.py): junk controllers and models",
    ),
    "RRProxy": "the wrapt proxy install() lays over a router method; never built by callers",
    "CPLayout": "a typing alias of CP_LAYOUTS",
    "CP_LAYOUTS": "a constant",
    "SUPPORTED": "a constant",
    **dict.fromkeys(
        (
            "MegatronNotInstalledError",
            "ReplayConfigError",
            "ReplayNotEquivalentWarning",
            "UnsupportedMegatronError",
        ),
        "an error or warning class",
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rmc,
    swept_above=SWEPT_ABOVE,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_SWEPT_HERE,
    group=st.one_of(st.none(), ANYTHING),
)


def test_an_empty_payload_goes_over_the_wire() -> None:
    """Found by the junk sweep: an empty int16 tensor's flat view had stride 0, which
    ``view(torch.uint8)`` refused (a rank with no rows to gather)."""
    from rr_megatron_compat._wire import as_wire_bytes, from_wire_bytes

    for t in (torch.zeros(0, 3, 2, dtype=torch.int16), torch.zeros(0, dtype=torch.int64)):
        wire = as_wire_bytes(t)
        assert wire.dtype == torch.uint8
        assert wire.numel() == 0
        assert torch.equal(from_wire_bytes(wire, t.dtype, tuple(t.shape)), t)
