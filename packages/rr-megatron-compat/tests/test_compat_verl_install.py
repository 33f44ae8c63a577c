"""``rr_megatron_compat.verl.install()`` against the real verl 0.9.1 package: every name verl
imports from its router-replay modules exists in rr's, and install / uninstall walk a state
machine (engine module imported before or after, twice each way, a foreign patch in between).

Skipped where verl is not installed (the ``verl`` nox session installs it)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import rr_megatron_compat.verl as rv
from rr_core import AlignmentError
from rr_megatron_compat.verl import _switch as switch

VERL = importlib.util.find_spec("verl")
pytestmark = pytest.mark.skipif(VERL is None, reason="verl is not installed")

ROUTER_MODULES = (
    "verl.utils.megatron.router_replay_patch",
    "verl.utils.megatron.router_replay_utils",
)
ENGINE = "verl.workers.engine.megatron.transformer_impl"


def verl_imports() -> dict[str, set[str]]:
    """Every ``from <router-replay module> import name`` in verl's own source, by file."""
    assert VERL is not None
    assert VERL.submodule_search_locations
    root = Path(next(iter(VERL.submodule_search_locations)))
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in ROUTER_MODULES:
                found.setdefault(str(path.relative_to(root)), set()).update(
                    alias.name for alias in node.names
                )
    return found


def test_every_name_verl_imports_from_its_router_replay_modules_exists() -> None:
    imports = verl_imports()
    assert "workers/engine/megatron/transformer_impl.py" in imports
    names = set().union(*imports.values())
    assert "merge_nested_router_maps" in names
    missing = sorted(name for name in names if not hasattr(rv, name))
    assert not missing, f"verl imports {missing} from its router-replay modules; rr lacks them"


def verl_module_names(module: str) -> set[str]:
    """The names a verl router-replay module binds at its top level (defined or imported, in
    ``try`` blocks too), read from its source."""
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Try):
            statements.extend([*node.body, *(s for h in node.handlers for s in h.body)])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_module_level_name_of_verls_modules_is_on_rrs_module(verl_modules: None) -> None:
    expected = {ROUTER_MODULES[0]: "patched_routing", ROUTER_MODULES[1]: "mpu"}
    for module in ROUTER_MODULES:
        names = verl_module_names(module)
        assert expected[module] in names
        missing = sorted(name for name in names if not hasattr(rv, name))
        assert not missing, f"{module} binds {missing}; rr_megatron_compat.verl lacks them"


@pytest.fixture(scope="module")
def verl_modules() -> Iterator[None]:
    from rr_fakes.shims.megatron import megatron_cpu

    with megatron_cpu():
        for name in (*ROUTER_MODULES, ENGINE):
            importlib.import_module(name)
        yield


def _engine() -> Any:
    return sys.modules[ENGINE]


def _reimport_engine() -> Any:
    """verl's engine module imported afresh (as in a process that imports it after install)."""
    from rr_fakes.shims.megatron import megatron_cpu

    registry = importlib.import_module("verl.workers.engine.base").EngineRegistry
    engines, registry._engines = registry._engines, {}  # the module registers its classes
    sys.modules.pop(ENGINE, None)
    try:
        with megatron_cpu():
            return importlib.import_module(ENGINE)
    finally:
        registry._engines = engines


ENGINE_NAMES = ("RouterReplay", "set_router_replay_data", "merge_nested_router_maps")


def test_install_switches_verl_names_and_uninstall_gives_them_back(verl_modules: None) -> None:
    utils = sys.modules[ROUTER_MODULES[1]]
    originals = {n: getattr(_engine(), n) for n in ENGINE_NAMES}
    replaced = rv.install()
    try:
        assert f"{ENGINE}.set_router_replay_data" in replaced
        assert f"{ROUTER_MODULES[0]}.apply_router_replay_patch" in replaced
        for name in ENGINE_NAMES:
            assert getattr(_engine(), name) is getattr(rv, name)
            assert getattr(utils, name) is getattr(rv, name)
        assert rv.install() == replaced  # idempotent
        assert rv.is_installed()
    finally:
        rv.uninstall()
    assert not rv.is_installed()
    assert {n: getattr(_engine(), n) for n in ENGINE_NAMES} == originals
    rv.uninstall()  # twice: nothing to do
    assert {n: getattr(_engine(), n) for n in ENGINE_NAMES} == originals


def test_the_drop_in_is_an_rr_adapter_install_uninstall_count_and_attach(
    verl_modules: None,
) -> None:
    import rr_megatron_compat as rmc
    from rr_core import ReplayController
    from rr_core.adapters import Adapter, adapters, leaked_patches
    from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, model_parallel

    assert isinstance(rv.ADAPTER, Adapter)
    assert adapters()["verl"] is rv.ADAPTER
    assert rv.attach == rv.ADAPTER.attach  # attach / detach are the Megatron side's
    assert rv.install is switch.install  # install is the switch of every verl side
    names = rv.install()
    try:
        assert rv.is_installed()
        rmc.uninstall()  # the Megatron hooks under the drop-in taken out: not installed
        assert not rv.is_installed()
        assert rv.install() == names
        assert rv.is_installed()
        with model_parallel():
            model = build_gpt(TinyGPTConfig(extra=rmc.replay_config_fields()))
            controller = ReplayController(num_experts=8, top_k=2)
            attached = rv.attach(controller, model)
            assert attached.adapter == "verl"
            assert attached.layer_numbers == controller.layer_numbers != ()
            rv.detach(controller)
            assert controller.layer_numbers == ()
    finally:
        removed = rv.uninstall()
    assert removed >= len(names)  # every name switched, and the router patch
    assert rv.uninstall() == 0
    assert not rv.is_installed()
    assert "verl" not in leaked_patches()


def test_an_engine_imported_after_install_gets_rr_and_a_foreign_patch_is_kept(
    verl_modules: None,
) -> None:
    originals = {n: getattr(_engine(), n) for n in ENGINE_NAMES}
    rv.install()
    try:
        engine = _reimport_engine()
        assert all(getattr(engine, n) is getattr(rv, n) for n in ENGINE_NAMES)

        def foreign(*args: Any, **kwargs: Any) -> None:
            """another library's patch"""

        engine.set_router_replay_data = foreign
    finally:
        rv.uninstall()
    engine = _engine()
    assert engine.set_router_replay_data is foreign  # never undo someone else's patch
    engine = _reimport_engine()  # a fresh import after uninstall sees verl's own names
    assert {n: getattr(engine, n) for n in ENGINE_NAMES} == originals


class VerlInstallMachine(RuleBasedStateMachine):
    """install / uninstall in any order, with fresh engine imports in between: verl's engine
    sees rr exactly while installed, and its own names otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.installed = False
        self.own = {n: getattr(sys.modules[ROUTER_MODULES[1]], n, None) for n in ENGINE_NAMES}
        self.own["RouterReplay"] = sys.modules[ROUTER_MODULES[0]].RouterReplay

    @rule(times=st.integers(1, 2))
    def install(self, times: int) -> None:
        for _ in range(times):
            rv.install()
        self.installed = True

    @rule(times=st.integers(1, 2))
    def uninstall(self, times: int) -> None:
        for _ in range(times):
            rv.uninstall()
        self.installed = False

    @rule()
    def import_engine_again(self) -> None:
        _reimport_engine()

    @invariant()
    def engine_names_match_the_state(self) -> None:
        engine = _engine()
        for name in ENGINE_NAMES:
            want = getattr(rv, name) if self.installed else self.own[name]
            assert getattr(engine, name) is want, (name, self.installed)
        assert rv.is_installed() is self.installed

    def teardown(self) -> None:
        rv.uninstall()


@pytest.mark.usefixtures("verl_modules")
def test_install_state_machine() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        VerlInstallMachine, settings=settings(max_examples=12, stateful_step_count=6, deadline=None)
    )


def _jagged(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


@pytest.mark.parametrize("seed", range(4))
def test_r3_alignment_mask_and_merge_equal_verls_own(verl_modules: None, seed: int) -> None:
    """Same inputs through verl's functions and rr's: identical tensors, bit for bit."""
    utils = sys.modules[ROUTER_MODULES[1]]
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (5,), generator=g).tolist()
    short = torch.randint(0, 2, (5,), generator=g).tolist()
    routes = _jagged(
        [
            torch.randint(0, 64, (n - s, 3, 4), generator=g).to(torch.int16)
            for n, s in zip(lengths, short, strict=True)
        ]
    )
    input_ids = _jagged([torch.randint(0, 100, (n,), generator=g) for n in lengths])
    response = torch.randint(0, 2, (5, 6), generator=g)
    response[0] = 0  # a sequence without a response stays native
    for ours, theirs in (
        (
            rv.align_r3_router_replay_data(routes, input_ids),
            utils.align_r3_router_replay_data(routes, input_ids),
        ),
        (
            rv.build_r3_replay_mask(input_ids, response),
            utils.build_r3_replay_mask(input_ids, response),
        ),
        (
            rv.merge_nested_router_maps([routes, routes]),
            utils.merge_nested_router_maps([routes, routes]),
        ),
    ):
        assert ours.dtype == theirs.dtype
        assert torch.equal(ours.offsets(), theirs.offsets())
        assert torch.equal(ours.values(), theirs.values())
    bad = _jagged(
        [torch.zeros((n - 2 if n > 2 else n + 1, 3, 4), dtype=torch.int16) for n in lengths]
    )
    with pytest.raises(AlignmentError, match="expected equal lengths or exactly one missing"):
        rv.align_r3_router_replay_data(bad, input_ids)


def test_after_install_a_patch_on_verls_own_module_changes_what_rr_does(
    verl_modules: None, megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's tests (and users' hot-fixes) patch the helpers verl's router_replay_utils imports
    (the SP scatter, the packing, device_name) on that module. Once install() has put rr's
    functions there, rr reads those names where verl's code would, so the patch still takes
    effect; after uninstall rr's own module is what counts again."""
    from compat_megatron_steps import build, random_targets

    utils = sys.modules[ROUTER_MODULES[1]]
    model = build()
    routes = random_targets(6, 4).unsqueeze(0)  # [1, 6, 4, K]
    calls: list[str] = []

    def pack(x: torch.Tensor, mask: Any, **kw: Any) -> tuple[torch.Tensor, None]:
        calls.append("pack")
        return x, None

    rv.install()
    try:
        assert utils.set_router_replay_data is rv.set_router_replay_data
        monkeypatch.setattr(utils, "preprocess_packed_seqs", pack)
        monkeypatch.setattr(utils, "scatter_to_sequence_parallel_region", lambda x: (x + 1) % 8)
        monkeypatch.setattr(utils, "device_name", "cpu")
        utils.set_router_replay_data(routes, None, model.config, model=model)
        assert calls == ["pack"]
        for layer, view in rv.iter_model_routers(model):
            assert torch.equal(view.target_topk_idx, (routes[0, :, layer - 1] + 1) % 8)
    finally:
        rv.RouterReplay.clear_global_indices()
        rv.uninstall()
    rv.set_router_replay_data(routes, None, model.config, model=model)  # verl's patch ignored
    assert calls == ["pack"]
    for layer, view in rv.iter_model_routers(model):
        assert torch.equal(view.target_topk_idx, routes[0, :, layer - 1])
    rv.RouterReplay.clear_global_indices()
    monkeypatch.undo()
