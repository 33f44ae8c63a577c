"""The controller is built of parts that each own their state: a class in rr_core.replay reads
only the private attributes it sets itself, and no code there reaches into another object's
private attributes; names that moved keep working from their old modules for one release."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path
from typing import ClassVar

import pytest

import rr_core.replay

REPLAY = Path(rr_core.replay.__file__).parent
MODULES = sorted(REPLAY.glob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _self_attribute(node: ast.AST) -> str | None:
    """``name`` of a ``self.name`` expression, else None."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _strays(source: str) -> list[str]:
    """Per class, the private ``self._x`` it reads without setting or defining ``_x`` itself."""
    strays = []
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        own = {
            target.id
            for item in cls.body
            if isinstance(item, (ast.Assign, ast.AnnAssign))
            for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
            if isinstance(target, ast.Name)
        }
        own |= {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        read = set()
        for node in ast.walk(cls):
            name = _self_attribute(node)
            if name is None or not _private(name):
                continue
            if isinstance(node.ctx, ast.Store):  # type: ignore[attr-defined]
                own.add(name)
            else:
                read.add(name)
        strays += [f"{cls.name}.{name}" for name in sorted(read - own)]
    return strays


def test_each_class_reads_only_the_private_state_it_sets() -> None:
    """A mixin reading attributes another class sets (the one-object controller: 17 attributes
    declared in one place, read from five modules) fails here."""
    strays = {path.name: _strays(path.read_text()) for path in MODULES}
    assert {name: found for name, found in strays.items() if found} == {}


def test_the_check_sees_state_shared_through_a_base_class() -> None:
    shared = (
        "class State:\n    _armed: dict\n\n"
        "class Arming(State):\n    def arm(self):\n        self._armed[0] = 1\n"
    )
    assert _strays(shared) == ["Arming._armed"]


#: Private attributes of torch that the replay path must use (autograd's graph and engine).
TORCH_PRIVATE = {"_C", "_current_graph_task_id", "_execution_engine", "_base"}


def test_no_code_reads_another_objects_private_attributes() -> None:
    """``self._x`` only: a facade that reached into a part (``self._targets._armed``) or a part
    into another (``routers._modes``) would share state again."""
    reached = [
        f"{path.name}:{node.lineno}: {ast.unparse(node)}"
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and _private(node.attr)
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        and node.attr not in TORCH_PRIVATE
    ]
    assert reached == []


def test_replay_modules_stay_short() -> None:
    lengths = {path.name: len(path.read_text().splitlines()) for path in MODULES}
    assert {name: n for name, n in lengths.items() if n > 450} == {}


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("rr_core.replay.modes", "check_routes", "rr_core.replay.checks"),
        ("rr_core.replay.modes", "check_hashable", "rr_core.replay.checks"),
        ("rr_core.replay.modes", "layer_numbers_of", "rr_core.replay.checks"),
        ("rr_core.replay.modes", "unchecked_ids_error", "rr_core.replay.checks"),
        ("rr_core.replay.modes", "ID_DTYPES", "rr_core.replay.checks"),
        ("rr_core.replay.targets", "check_target_ids", "rr_core.replay.checks"),
        ("rr_core.replay.state", "Armed", "rr_core.replay.armed"),
        ("rr_core.replay.state", "DEFAULT_MICROBATCH", "rr_core.replay.scope"),
    ],
)
def test_moved_names_still_work_with_a_deprecation_warning(old: str, name: str, new: str) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)


def test_a_name_that_never_lived_there_is_an_attribute_error() -> None:
    modes = importlib.import_module("rr_core.replay.modes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning for a name that never moved
        with pytest.raises(AttributeError, match="has no attribute 'check_everything'"):
            modes.check_everything  # noqa: B018
    assert not hasattr(modes, "check_everything")


def test_controller_module_keeps_its_public_names() -> None:
    """What adapters import from rr_core.replay.controller is still there, undeprecated."""
    controller = importlib.import_module("rr_core.replay.controller")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in controller.__all__:
            assert getattr(controller, name) is not None


def test_subclasses_still_read_the_one_object_controllers_names() -> None:
    """Subclasses (a recorder that watches its routers) and adapters read ``_routers``,
    ``_layers``, ``_index``, ``_armed`` and ``_forward_mb``: read-only views of the parts'
    state now."""
    import torch
    from torch import nn

    from rr_core import ReplayController, ReplayMode, TopK, router_topk

    class Router(nn.Module):
        def __init__(self, layer_number: int) -> None:
            super().__init__()
            self.layer_number = layer_number

    class Watching(ReplayController):
        seen: ClassVar[list[tuple[int, int, bool]]] = []

        def route(self, router: nn.Module, scores_TE: torch.Tensor, k: int, **kw: object) -> TopK:
            layer = self._layers[self._index[id(router)]]
            self.seen.append((layer, self._routers.index(router), 0 in self._armed))
            return super().route(router, scores_TE, k)

    routers = [Router(2), Router(1)]
    controller = Watching(num_experts=4, top_k=2)
    controller.attach(nn.ModuleList(routers))
    try:
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, torch.tensor([[[0, 1], [2, 3]]]), layer_numbers=[1, 2])
        for router in routers:
            router_topk(router, torch.rand(1, 4), 2)
        assert Watching.seen == [(2, 1, True), (1, 0, True)]
        assert controller._forward_mb is None
        with controller.microbatch(7):
            assert controller._forward_mb == 7
        with pytest.raises(TypeError):
            controller._armed[1] = controller._armed[0]  # type: ignore[index]
        controller.end_step()
    finally:
        controller.detach()
