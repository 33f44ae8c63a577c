"""Bad inputs to the replay controller raise ReplayError, and what arm() accepts is replayed
exactly: modes, arming before attach, route tensors of the wrong kind, unchecked ids."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rr_core import ReplayController, ReplayError, ReplayMode, RouteBatch, RouteMeta, RRError
from rr_fakes import distinct_ids

from rr_core_testing import E, H, K, TinyModel


def routes(t: int, layers: int = 2, *, seed: int = 2) -> torch.Tensor:
    return distinct_ids(t, layers, num_experts=E, top_k=K, seed=seed, dtype=torch.uint8)


def x(t: int) -> torch.Tensor:
    return torch.randn(t, H, generator=torch.Generator().manual_seed(t))


# -- modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["off", "record", "replay"])
def test_a_mode_given_as_its_exact_value_is_that_mode(
    controller: ReplayController, value: str
) -> None:
    layers = controller.attach(TinyModel(num_layers=2))
    controller.set_mode(value)
    assert all(controller.mode_of(layer) is ReplayMode(value) for layer in layers)


def test_set_mode_off_as_a_string_routes_natively_with_targets_armed(
    controller: ReplayController,
) -> None:
    model = TinyModel(num_layers=2)
    model(x(5))
    native = model.routed_ids()
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    targets = (native.long() + 1) % E  # differs from native on every row
    controller.arm(0, targets, layer_numbers=layers)
    controller.set_mode("off")
    model(x(5))
    assert torch.equal(model.routed_ids(), native)
    controller.release(0)


@pytest.mark.parametrize(
    "bad",
    ["OFF", "Record", "record ", " replay", "", "native", b"off", 1, 0, 2, True, None, 1.0,
     ["off"], ("replay",), {"mode": "off"}, np.str_("REPLAY"), ReplayMode],
)  # fmt: skip
def test_set_mode_rejects_anything_but_a_mode_or_its_exact_value(
    controller: ReplayController, bad: Any
) -> None:
    layers = controller.attach(TinyModel(num_layers=2))
    controller.set_mode(ReplayMode.RECORD)
    with pytest.raises(ReplayError, match=r"mode must be one of ReplayMode\.OFF \('off'\), "):
        controller.set_mode(bad)
    assert all(controller.mode_of(layer) is ReplayMode.RECORD for layer in layers)


def test_set_mode_checks_its_layers(controller: ReplayController) -> None:
    controller.attach(TinyModel(num_layers=2))
    for bad in (1, "12", [1.5], [True], [0]):
        with pytest.raises(ReplayError, match="1-based"):
            controller.set_mode(ReplayMode.REPLAY, layers=bad)
    with pytest.raises(ReplayError, match=r"layers \[3\] have no attached router"):
        controller.set_mode(ReplayMode.REPLAY, layers=[3])
    controller.set_mode(ReplayMode.REPLAY, layers=np.array([2]))
    assert controller.mode_of(2) is ReplayMode.REPLAY
    assert controller.mode_of(1) is ReplayMode.OFF


def test_controller_geometry_must_be_ints() -> None:
    for kw in ({"num_experts": 6.0, "top_k": 2}, {"num_experts": 6, "top_k": True}):
        with pytest.raises(ReplayError, match="must be ints"):
            ReplayController(**kw)  # type: ignore[arg-type]


# -- before attach ---------------------------------------------------------------------------


def test_arm_before_attach_raises() -> None:
    ctrl = ReplayController(num_experts=E, top_k=K)
    with pytest.raises(ReplayError, match=r"no model attached; call attach\(model\) before arm"):
        ctrl.arm(0, routes(3), layer_numbers=[1, 2])
    meta = RouteMeta(num_experts=E, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2))
    batch = RouteBatch.from_sequences([routes(3)], meta)
    with pytest.raises(ReplayError, match="before arm_batch"):
        ctrl.arm_batch(0, batch)
    with pytest.raises(ReplayError, match="before set_mode"):
        ctrl.set_mode(ReplayMode.REPLAY)


def test_a_stage_without_moe_layers_still_arms(controller: ReplayController) -> None:
    assert controller.attach(TinyModel(num_layers=2, moe=[False, False])) == ()
    controller.arm(0, routes(3), layer_numbers=[1, 2])  # A6: it takes part, replays nothing
    controller.release(0)


def test_arm_batch_takes_only_a_route_batch(controller: ReplayController) -> None:
    controller.attach(TinyModel(num_layers=2))
    with pytest.raises(
        ReplayError, match=r"arm_batch takes a RouteBatch; got a torch\.uint8 tensor"
    ):
        controller.arm_batch(0, routes(3))  # type: ignore[arg-type]


# -- route tensors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (routes(3).float(), "integer expert ids .*got torch.float32"),
        (routes(3).bool(), "integer expert ids .*got torch.bool"),
        (routes(3).to(torch.bfloat16), "got torch.bfloat16"),
        (routes(3).to(torch.complex64), "got torch.complex64"),
        (routes(3).numpy(), r"must be a torch.Tensor .*got ndarray \(wrap it with torch.from"),
        (routes(3).tolist(), "must be a torch.Tensor .*got list"),
        (None, "got NoneType"),
        (routes(3)[:, 0], r"routes must be \[T, 2, 2\] .*got \[3, 2\]"),
        (routes(3)[None], r"routes must be \[T, 2, 2\] .*got \[1, 3, 2, 2\]"),
        (routes(3, 3), r"routes must be \[T, 2, 2\] .*got \[3, 3, 2\]"),
        (routes(3).to_sparse(), "dense"),
    ],
)
def test_arm_rejects_routes_of_the_wrong_kind(
    controller: ReplayController, given: Any, message: str
) -> None:
    layers = controller.attach(TinyModel(num_layers=2))
    with pytest.raises(ReplayError, match=message):
        controller.arm(0, given, layer_numbers=layers)
    assert controller.end_step().replayed_microbatches == ()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"layer_numbers": None}, "layer_numbers must be a sequence .*got NoneType"),
        ({"layer_numbers": 2}, "layer_numbers must be a sequence .*got int"),
        ({"layer_numbers": "12"}, "got str"),
        ({"layer_numbers": [1.0, 2.0]}, r"integer layer numbers; got \[1.0, 2.0\]"),
        ({"layer_numbers": [True, 2]}, "integer layer numbers"),
        ({"layer_numbers": [0, 1]}, "1-based"),
        ({"replay_mask_T": [True] * 3}, "replay mask must be a bool torch.Tensor .*got list"),
        ({"replay_mask_T": np.ones(3, bool)}, "got ndarray"),
        ({"replay_mask_T": torch.ones(3, dtype=torch.uint8)}, "replay mask must be bool"),
        ({"replay_mask_T": torch.ones(4, dtype=torch.bool)}, r"bool \[3\]; got torch.bool \[4\]"),
        ({"validate": "no"}, "validate must be True or False"),
        ({"validate": False, "ids_validated": 1}, "ids_validated must be True or False; got 1"),
    ],
)
def test_arm_rejects_bad_layer_numbers_masks_and_flags(
    controller: ReplayController, kw: dict[str, Any], message: str
) -> None:
    layers = controller.attach(TinyModel(num_layers=2))
    args: dict[str, Any] = {"layer_numbers": layers, **kw}
    with pytest.raises(ReplayError, match=message):
        controller.arm(0, routes(3), **args)


def test_arm_takes_numpy_and_torch_layer_numbers(controller: ReplayController) -> None:
    controller.attach(TinyModel(num_layers=2))
    for numbers in (np.array([1, 2]), torch.tensor([1, 2]), range(1, 3)):
        controller.arm(0, routes(3), layer_numbers=numbers)
        controller.release(0)


def test_an_unhashable_microbatch_id_raises(controller: ReplayController) -> None:
    layers = controller.attach(TinyModel(num_layers=2))
    with pytest.raises(ReplayError, match=r"micro-batch id must be hashable .*got list"):
        controller.arm([0], routes(3), layer_numbers=layers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, "int64", torch.uint8])
def test_recorded_refuses_a_dtype_that_changes_ids(dtype: Any) -> None:
    ctrl = ReplayController(num_experts=300, top_k=2)
    with pytest.raises(ReplayError, match="holding ids up to 299"):
        ctrl.recorded(0, dtype=dtype)


# -- unchecked ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "span"), [(E, rf"\[0, {E}\]"), (-1, r"\[-1, 5\]")])
def test_unchecked_out_of_range_ids_raise_when_replayed(
    controller: ReplayController, bad: int, span: str
) -> None:
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    targets = routes(4).to(torch.int16)
    targets[1, 1] = torch.tensor([bad, 5])
    targets[0, 0] = torch.tensor([0, 1])
    controller.arm(0, targets, layer_numbers=layers, validate=False)
    with pytest.raises(
        ReplayError, match=rf"layer 2, micro-batch 0: armed ids span {span}, outside \[0, {E}\)"
    ):
        model(x(4))
    controller.release(0)


def test_unchecked_bad_ids_on_native_rows_are_never_used(controller: ReplayController) -> None:
    model = TinyModel(num_layers=2)
    layers = controller.attach(model)
    controller.set_mode(ReplayMode.REPLAY)
    targets = routes(3).to(torch.int64)
    targets[2] = 99
    mask = torch.tensor([True, True, False])
    controller.arm(0, targets, layer_numbers=layers, replay_mask_T=mask, validate=False)
    model(x(3))
    controller.end_step()
    assert torch.equal(model.routed_ids()[:2], targets[:2])


# -- property: exact or RRError --------------------------------------------------------------


def _mostly(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
    """``good`` about five times in six, else one of ``bad``."""
    return st.sampled_from([*good] * (5 * max(1, len(bad))) + [*bad] * len(good))


_INT_DTYPES = [
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64,
]  # fmt: skip
_OTHER_DTYPES = [
    torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64
]  # fmt: skip


@st.composite
def route_inputs(draw: st.DrawFn) -> Any:
    """Mostly ``[T, 2, 2]`` distinct ids in an integer dtype, some ids mutated; else tensors of
    another dtype or shape, numpy arrays, lists and other python values."""
    kind = draw(_mostly(["tensor"], ["numpy", "list", "scalar", "none", "str"]))
    t = draw(st.integers(0, 6))
    shape = draw(_mostly([(t, 2, K)], [(t, K), (t, 3, K), (t, 2, 3), (1, t, 2, K), ()]))
    if shape == (t, 2, K):
        base = distinct_ids(t, 2, num_experts=E, top_k=K, seed=draw(st.integers(0, 99)))
    else:
        base = torch.zeros(shape, dtype=torch.int64)
    values = base.to(torch.int64).clone()
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        if values.numel():
            flat = values.view(-1)
            big = st.integers(-(2**40), 2**40)
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.integers(-2, E + 1) | big)
    tensor = values.to(draw(_mostly(_INT_DTYPES, _OTHER_DTYPES)))
    if kind == "tensor":
        return tensor
    if kind == "numpy":
        return values.numpy()
    if kind == "list":
        return values.tolist()
    return {"scalar": 3, "none": None, "str": "routes"}[kind]


_LAYER_NUMBERS = _mostly(
    [(1, 2), [1, 2], (2, 1), np.array([1, 2]), torch.tensor([1, 2])],
    [(1, 2, 3), (1,), (), None, 2, "12", [1.0, 2.0], (0, 1, 2), [1, 1], [True, 2]],
)


@settings(max_examples=300, deadline=None)
@given(
    given_routes=route_inputs(),
    layer_numbers=_LAYER_NUMBERS,
    mask_kind=_mostly(["none", "bool"], ["short", "uint8", "list"]),
    validate=_mostly([True, False], ["yes", None, 1]),
    microbatch=_mostly([0, "mb", (1, 2)], [[0], ((0,), [1]), {}]),
    data=st.data(),
)
def test_arm_accepts_exactly_what_it_was_given_or_raises_an_rr_error(
    given_routes: Any,
    layer_numbers: Any,
    mask_kind: str,
    validate: Any,
    microbatch: Any,
    data: st.DataObject,
) -> None:
    model = TinyModel(num_layers=2)
    ctrl = ReplayController(num_experts=E, top_k=K)
    try:
        layers = ctrl.attach(model)
        ctrl.set_mode(ReplayMode.REPLAY)
        t = (
            given_routes.shape[0]
            if isinstance(given_routes, torch.Tensor) and given_routes.dim()
            else 0
        )
        mask = {
            "none": None,
            "bool": torch.tensor(
                data.draw(st.lists(st.booleans(), min_size=t, max_size=t)), dtype=torch.bool
            ),
            "short": torch.ones(t + 1, dtype=torch.bool),
            "uint8": torch.ones(t, dtype=torch.uint8),
            "list": [True] * t,
        }[mask_kind]
        try:
            ctrl.arm(
                microbatch,
                given_routes,
                layer_numbers=layer_numbers,
                replay_mask_T=mask,
                validate=validate,
            )
        except RRError as e:
            event(f"refused at arm: {str(e).split(':')[-1][:24]}")
            return
        assert isinstance(given_routes, torch.Tensor)
        snapshot = given_routes.to(torch.int64)
        with ctrl.microbatch(microbatch):
            try:
                model(x(t))
            except RRError:
                assert validate is False  # only unchecked ids may fail when replayed
                event("unchecked ids refused when replayed")
                return
        slot = {int(n): i for i, n in enumerate(layer_numbers)}
        rows = torch.ones(t, dtype=torch.bool) if mask is None else mask
        used = model.routed_ids()
        for j, layer in enumerate(layers):
            assert torch.equal(used[rows, j], snapshot[rows, slot[layer]])
        event(f"replayed exactly (validate={validate})")
        if validate:
            assert bool(((snapshot[rows] >= 0) & (snapshot[rows] < E)).all())
    finally:
        ctrl.detach()


def test_none_is_not_a_microbatch_id(controller: ReplayController) -> None:
    """Routers outside any micro-batch scope fire as micro-batch 0, so targets armed under None
    would never be found (found by the transformers sweep): refused wherever an id is taken."""
    controller.attach(TinyModel(num_layers=2))
    for call in (
        lambda: controller.arm(None, routes(3), layer_numbers=[1, 2]),
        lambda: controller.microbatch(None).__enter__(),
        lambda: controller.recorded(None),
    ):
        with pytest.raises(ReplayError, match="None is not a micro-batch id"):
            call()
