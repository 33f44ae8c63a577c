"""Property sweep over rr_transformers' entry points on generated input, valid or not: each call
returns a result that passes its own invariant (every route row where the layout puts its
token) or raises an RRError subclass, never a bare IndexError/RuntimeError/KeyError/TypeError
from inside, never a silently wrong answer.

Entry points covered:

- ``routes_for_padded``, ``routes_for_packed`` (generated batches and layouts: masks and
  position ids of any dtype, shape and content)
- ``arm_routes`` (the same layouts and odd micro-batch ids, through a ReplayController on a
  model of routers calling ``router_topk``, the armed rows checked against the batch)
- ``attach``, ``detach``, ``install`` argument checks (wrong controller, model and options)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

import rr_transformers
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta, router_topk
from rr_fakes.pytest_support import settles
from rr_fakes.sweeps import JUNK, SWEEP, adapter_refuses, public_api_tests
from rr_transformers import arm_routes, routes_for_packed, routes_for_padded

E, K, L = 6, 2, 2
META = RouteMeta(num_experts=E, top_k=K, layer_axis="all_layers", layer_numbers=(1, 2))


@st.composite
def batches(draw: st.DrawFn) -> RouteBatch:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    lengths = draw(st.lists(st.integers(0, 4), max_size=3))
    seqs = [rng.random((n, L, E)).argsort(-1)[..., :K] for n in lengths]
    valid = [rng.random(n) < 0.8 for n in lengths]
    return RouteBatch.from_sequences(seqs, META, valid=valid, allow_all_zero=True)


@st.composite
def layouts(draw: st.DrawFn, batch: RouteBatch) -> torch.Tensor | Any:
    """A layout that fits ``batch`` (attention mask or position ids), or a generated one."""
    lengths = batch.lengths.tolist()
    kind = draw(st.sampled_from(["mask", "positions", "random", "junk"]))
    if kind == "junk":
        return draw(JUNK)
    if kind == "random":
        dtype = draw(st.sampled_from([np.int64, np.int32, np.bool_, np.float32]))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
        if dtype is np.bool_:
            return torch.from_numpy(draw(hnp.arrays(dtype, shape)))
        return torch.from_numpy(draw(hnp.arrays(dtype, shape, elements=st.integers(-1, 6))))
    if kind == "mask":
        S = max(lengths, default=0) + draw(st.integers(0, 2))
        mask = torch.zeros(len(lengths), S, dtype=torch.int64)
        for b, n in enumerate(lengths):
            start = draw(st.integers(0, S - n))
            mask[b, start : start + n] = 1
        return mask
    return torch.cat([torch.arange(n) for n in lengths]) if lengths else torch.zeros(0)


def check_laid_out(batch: RouteBatch, layout: torch.Tensor, routes: Any, mask: Any) -> None:
    """Every valid route row lands on a row that replays it; no other row replays."""
    assert mask.dtype == torch.bool
    assert routes.shape[0] == mask.shape[0]
    assert int(mask.sum()) == int(batch.valid_N.sum())
    want = batch.values_NLK[batch.valid_N].to(torch.int64)
    got = routes[mask].to(torch.int64)
    assert torch.equal(got.sort(0).values, want.sort(0).values)


@SWEEP
@given(data=st.data(), batch=batches())
def test_routes_for_layouts(data: st.DataObject, batch: RouteBatch) -> None:
    layout = data.draw(layouts(batch))
    ok, out = settles(routes_for_padded, batch, layout)
    if ok:
        check_laid_out(batch, layout, *out)
    ok, out = settles(routes_for_packed, batch, layout)
    if ok:
        check_laid_out(batch, layout, *out)
    settles(routes_for_padded, data.draw(JUNK), layout)
    settles(routes_for_packed, data.draw(JUNK), layout)


class Router(nn.Module):
    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.weight = nn.Parameter(torch.randn(E, 4))
        self.last_ids: torch.Tensor | None = None

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        out = router_topk(self, torch.softmax(x_TH @ self.weight.t(), -1), K)
        self.last_ids = out.ids_TK
        return out.ids_TK


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Router(i + 1) for i in range(L))

    def forward(self, x_TH: torch.Tensor) -> None:
        for router in self.layers:
            router(x_TH)


MODEL = Model()


@SWEEP
@given(
    data=st.data(),
    batch=batches(),
    mb=st.one_of(st.integers(0, 2), st.just([]), JUNK),
    both=st.booleans(),
)
def test_arm_routes(data: st.DataObject, batch: RouteBatch, mb: Any, both: bool) -> None:
    layout = data.draw(layouts(batch))
    ctrl = ReplayController(num_experts=E, top_k=K)
    ctrl.attach(MODEL, walk=lambda m: [(r.layer_number, r) for r in m.layers])
    try:
        ctrl.set_mode(ReplayMode.REPLAY)
        padded = isinstance(layout, torch.Tensor) and layout.dim() == 2 and layout.shape[0] != 1
        kwargs = {"attention_mask": layout} if padded else {"position_ids": layout}
        if both:
            kwargs = {"attention_mask": layout, "position_ids": layout}
        ok, _ = settles(arm_routes, ctrl, mb, batch, **kwargs)
        if not ok:
            return
        laid = (routes_for_padded if padded else routes_for_packed)(batch, layout)
        T = laid[0].shape[0]
        with torch.no_grad(), ctrl.microbatch(mb):
            MODEL(torch.randn(T, 4))
        for slot, router in enumerate(MODEL.layers):
            assert router.last_ids is not None
            want = laid[0][:, slot].to(torch.int64)
            assert torch.equal(router.last_ids[laid[1]], want[laid[1]])
        ctrl.end_step()
    finally:
        ctrl.detach()
    settles(arm_routes, data.draw(JUNK), 0, batch, attention_mask=layout)


@SWEEP
@given(
    controller=st.one_of(st.just("real"), JUNK),
    model=st.sampled_from(["module", "none", "str", "list"]),
    score=st.one_of(st.none(), st.sampled_from(["softmax", "sigmoid", "tanh"]), JUNK),
    force=st.one_of(st.booleans(), JUNK),
)
def test_attach_arguments(controller: Any, model: str, score: Any, force: Any) -> None:
    ctrl = ReplayController(num_experts=E, top_k=K) if controller == "real" else controller
    the_model: Any = {"module": nn.Linear(2, 2), "none": None, "str": "m", "list": [None]}[model]
    adapter_refuses(rr_transformers, ctrl, the_model, force, score_function=score)


#: The entry points the sweeps above drive with generated batches and layouts, checking their
#: invariant.
SWEPT_ABOVE = (
    "arm_routes",
    "attach",
    "detach",
    "install",
    "routes_for_packed",
    "routes_for_padded",
)
#: Entry points whose invariant on arguments of any kind is "a result or an rr error".
SWEPT_WITH_JUNK = ("decoder_layers", "installed_transformers_version")
#: Public names that take no outside data, or whose checks another test drives.
NOT_SWEPT_HERE = {
    **dict.fromkeys(
        ("ADAPTER", "TransformersAdapter", "installed", "is_installed", "uninstall"),
        "the adapter protocol (tests/test_adapter_protocol.py): junk controllers and models",
    ),
    "RouterTopkProxy": "the wrapt proxy install() lays over a router; never built by callers",
    "Family": "a row of rr's own family table (KNOWN_FAMILIES), checked by the family tests",
    "KNOWN_FAMILIES": "a constant",
    "Attachment": "a record attach() returns",
    **dict.fromkeys(
        ("PackedForwardError", "RouterHookError", "TransformersVersionError", "UnknownFamilyError"),
        "an error class",
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rr_transformers,
    swept_above=SWEPT_ABOVE,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_SWEPT_HERE,
)
