"""Tiny MoE modules for rr-core's tests: real autograd, routers that call the replay hook; and the
small route batches the route tests share."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn
from torch.utils.checkpoint import checkpoint

from rr_core import LayoutConfig, ReplayController, ReplayMode, RouteBatch, RouteMeta, router_topk
from rr_fakes import distinct_ids


def rr_without_torch(*argv: str) -> subprocess.CompletedProcess[str]:
    """``rr argv`` in a fresh interpreter (its exit code is the command's), checked to have
    imported no torch and raised nothing."""
    code = (
        "import sys; from rr_core.cli.main import main; code = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert "Traceback" not in done.stderr, done.stderr
    return done


class RouterCall(NamedTuple):
    """The sizes of one router call as hypothesis drew them, and the seed of its tensors."""

    t: int  # rows (tokens)
    e: int  # experts
    k: int  # top-k, in [1, e]
    seed: int  # for torch.Generator().manual_seed: a failing example replays with its tensors


@st.composite
def router_calls(draw: st.DrawFn, *, rows: tuple[int, int], experts: tuple[int, int]) -> RouterCall:
    """Router calls of ``rows`` (min, max) rows over ``experts`` (min, max) experts, any k."""
    t, e = draw(st.integers(*rows)), draw(st.integers(*experts))
    return RouterCall(t, e, draw(st.integers(1, e)), draw(st.integers(0, 2**31)))


#: TinyModel's default sizes: E experts, K top-k, H hidden.
E, K, H = 6, 2, 8


class RecordingRouter(nn.Module):
    """Softmax router over E experts calling :func:`rr_core.router_topk`; it keeps its last
    scores with their gradient (``last_scores_TE``) and may lack a ``layer_number`` (the walk's
    error paths). Unlike :class:`rr_fakes.TinyRouter` it is seeded by the model's global seed."""

    def __init__(
        self, hidden: int, num_experts: int, top_k: int, *, layer_number: int | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, hidden) * 0.5)
        self.top_k = top_k
        if layer_number is not None:
            self.layer_number = layer_number
        self.last_scores_TE: torch.Tensor | None = None

    def forward(self, x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores_TE = torch.softmax(x_TH @ self.weight.t(), dim=-1)
        if scores_TE.requires_grad:
            scores_TE.retain_grad()
        self.last_scores_TE = scores_TE
        out = router_topk(self, scores_TE, self.top_k)
        return out.values_TK, out.ids_TK


class TinyLayer(nn.Module):
    """A decoder layer: MoE (router + linear experts) or dense (one linear)."""

    def __init__(
        self, layer_number: int, hidden: int, num_experts: int, top_k: int, *, moe: bool
    ) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.router = RecordingRouter(hidden, num_experts, top_k) if moe else None
        count = num_experts if moe else 1
        self.experts = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(count))
        self.last_ids_TK: torch.Tensor | None = None

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        if self.router is None:
            return x_TH + torch.tanh(self.experts[0](x_TH))
        probs_TK, ids_TK = self.router(x_TH)
        self.last_ids_TK = ids_TK
        out_TH = torch.zeros_like(x_TH)
        for e, expert in enumerate(self.experts):
            weight_T = (probs_TK * (ids_TK == e)).sum(dim=-1, keepdim=True)
            out_TH = out_TH + weight_T * torch.tanh(expert(x_TH))
        return x_TH + out_TH


class TinyDecoder(nn.Module):
    def __init__(self, layers: Sequence[TinyLayer], *, recompute: str | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.recompute = recompute  # None, "reentrant" or "non_reentrant"

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.recompute is None or not torch.is_grad_enabled():
                x_TH = layer(x_TH)
            else:
                reentrant = self.recompute == "reentrant"
                x_TH = checkpoint(layer, x_TH, use_reentrant=reentrant)
        return x_TH


class TinyModel(nn.Module):
    """``decoder`` plus an optional ``mtp`` block whose layers restart numbering at 1 (A4)."""

    def __init__(
        self,
        *,
        num_layers: int = 3,
        moe: Sequence[bool] | None = None,
        hidden: int = H,
        num_experts: int = E,
        top_k: int = K,
        first_layer_number: int = 1,
        mtp_layers: int = 0,
        recompute: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        pattern = list(moe) if moe is not None else [True] * num_layers
        self.embed = nn.Linear(hidden, hidden)  # its output carries grad into checkpointed layers
        self.decoder = TinyDecoder(
            [
                TinyLayer(first_layer_number + i, hidden, num_experts, top_k, moe=is_moe)
                for i, is_moe in enumerate(pattern)
            ],
            recompute=recompute,
        )
        self.mtp = (
            TinyDecoder(
                [TinyLayer(i + 1, hidden, num_experts, top_k, moe=True) for i in range(mtp_layers)]
            )
            if mtp_layers
            else None
        )

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        out_TH = self.decoder(self.embed(x_TH))
        if self.mtp is not None:
            out_TH = out_TH + 0.1 * self.mtp(out_TH)
        return out_TH

    def moe_layers(self) -> list[TinyLayer]:
        return [layer for layer in self.decoder.layers if layer.router is not None]

    def routed_ids(self) -> torch.Tensor:
        """``[T, L_moe, K]``: the ids each MoE layer used in the last forward."""
        return torch.stack([layer.last_ids_TK for layer in self.moe_layers()], dim=1)


# --- route batches (test_routes_*) ------------------------------------------------------------

#: Expert counts around each id dtype's bounds (uint8 holds 256 experts' ids, int16 32768).
EXPERT_COUNTS = (2, 8, 60, 64, 128, 160, 256, 257, 384, 512)


def route_meta(
    E: int = 8,
    K: int = 2,
    layers: tuple[int, ...] = (1, 2, 3),
    moe: tuple[int, ...] | None = (2, 3),
) -> RouteMeta:
    """An all_layers meta: E experts, top-K, decoder layers ``layers`` of which ``moe`` route."""
    return RouteMeta(
        num_experts=E, top_k=K, layer_axis="all_layers", layer_numbers=layers, moe_layer_numbers=moe
    )


def good_route_rows(N: int = 5) -> torch.Tensor:
    """Rows of a 3-layer all_layers batch (layer 1 dense), K=2, every row distinct ids."""
    v = torch.zeros(N, 3, 2, dtype=torch.int64)
    v[:, 1:, 0] = 1
    v[:, 1:, 1] = (torch.arange(N) % 6 + 2)[:, None]
    return v


# --- generated input for the property sweeps (test_core_sweep_*) ------------------------------

#: The settings of every sweep: 40 examples each, no deadline.
SWEEP = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Values of the wrong kind for any argument.
JUNK = st.sampled_from(
    [None, -1, 0, 1.5, "x", b"x", [], [1, "a"], (), {}, object(), float("nan"), True, 2**70]
)
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
ANY_DTYPES = [*INT_DTYPES, torch.float32, torch.float16, torch.bool]


@st.composite
def tensors(draw: st.DrawFn, *, max_dims: int = 4, high: int = 300) -> torch.Tensor:
    dtype = draw(st.sampled_from(ANY_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=4))
    if dtype.is_floating_point:
        values = draw(hnp.arrays(np.float32, shape, elements=st.floats(-2, high, width=32)))
        return torch.from_numpy(values).to(dtype)
    if dtype is torch.bool:
        return torch.from_numpy(draw(hnp.arrays(np.bool_, shape)))
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -3), min(info.max, high)
    values = draw(hnp.arrays(np.int64, shape, elements=st.integers(lo, hi)))
    return torch.from_numpy(values).to(dtype)


ANYTHING = st.one_of(JUNK, tensors(), st.integers(-5, 400))


@st.composite
def metas(draw: st.DrawFn) -> RouteMeta:
    E = draw(st.integers(1, 300))
    K = draw(st.integers(1, min(E, 4)))
    L = draw(st.integers(1, 4))
    numbers = tuple(range(1, L + 1))
    moe = draw(st.one_of(st.none(), st.sets(st.sampled_from(numbers), min_size=1)))
    return RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis="all_layers",
        layer_numbers=numbers,
        moe_layer_numbers=None if moe is None else tuple(sorted(moe)),
    )


@st.composite
def valid_batches(draw: st.DrawFn) -> RouteBatch:
    meta = draw(metas())
    E, K, L = meta.num_experts, meta.top_k, len(meta.layer_numbers)
    lengths = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    seqs = []
    for n in lengths:
        ids = np.array([rng.permutation(E)[:K] for _ in range(n * L)]).reshape(n, L, K)
        ids[:, list(meta.dense_slots)] = 0
        seqs.append(ids.astype(np.int64))
    valid = [rng.random(n) < 0.8 for n in lengths]
    return RouteBatch.from_sequences(seqs, meta, valid=valid, allow_all_zero=True)


# --- pipeline stages (test_layout_*) ----------------------------------------------------------

#: A pipeline stage: ``(pp_rank, vp_stage)``, ``vp_stage`` None without virtual pipelining.
Stage = tuple[int, int | None]


def stages_in_order(cfg: LayoutConfig) -> list[Stage]:
    """Every (pp_rank, vp_stage) in the order Megatron lays layers out: vp_stage, then pp_rank."""
    if cfg.vp_size is None:
        return [(p, None) for p in range(cfg.pp_size)]
    return [(p, v) for v in range(cfg.vp_size) for p in range(cfg.pp_size)]


# --- random route batches (codec and record tests) ---------------------------------------------


def random_batch(
    rng: np.random.Generator,
    E: int,
    K: int,
    *,
    lengths: list[int],
    layers: int = 3,
    dense: tuple[int, ...] = (),
    valid_share: float = 0.7,
) -> RouteBatch:
    """Distinct ids per (row, MoE layer); zeros on dense slots and invalid rows."""
    N, L = sum(lengths), layers
    moe = tuple(n for n in range(1, L + 1) if n not in dense)
    ids = rng.random((N * len(moe), E)).argsort(axis=1)[:, :K].reshape(N, len(moe), K)
    values = np.zeros((N, L, K), dtype=np.int64)
    values[:, [n - 1 for n in moe]] = ids
    valid = rng.random(N) < valid_share
    values[~valid] = 0
    axis = "all_layers" if dense else "moe_layers"
    meta = RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis=axis,
        layer_numbers=tuple(range(1, L + 1)),
        moe_layer_numbers=moe if dense else None,
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return RouteBatch(
        torch.from_numpy(values), offsets, torch.from_numpy(valid), meta, allow_all_zero=True
    )


def as_uint8(batch: RouteBatch) -> RouteBatch:
    """The same batch with uint8 ids: the set codec's fast path takes those (E <= 256, K = 8)."""
    v = batch.values_NLK.to(torch.uint8)
    return RouteBatch(v, batch.offsets_B1, batch.valid_N, batch.meta, allow_all_zero=True)


# --- replay controller on a tiny model (test_controller_*) -------------------------------------


def tokens(t: int, seed: int = 1) -> torch.Tensor:
    """``[t, H]`` seeded random inputs of the tiny model."""
    return torch.randn(t, H, generator=torch.Generator().manual_seed(seed))


def random_routes(t: int, layers: int, seed: int = 2) -> torch.Tensor:
    """``[t, layers, K]`` distinct ids per row, uint8 like a compact route batch."""
    return distinct_ids(t, layers, num_experts=E, top_k=K, seed=seed, dtype=torch.uint8)


def replaying_tiny_model(controller: ReplayController) -> tuple[TinyModel, tuple[int, ...]]:
    """A two-layer TinyModel attached to ``controller``, which is set to replay, and its
    layer numbers."""
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    return model, layers
