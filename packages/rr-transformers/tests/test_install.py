"""install / uninstall as a state machine: symmetric, idempotent, recognisable proxies with the
family's own signature, and never undoing a patch that is not rr's."""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import rr_transformers
from _helpers import FAMILIES, VERSION
from rr_core import ReplayController, WalkError
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, tiny_model
from rr_transformers import KNOWN_FAMILIES, RouterHookError, RouterTopkProxy


def _sites():
    return {name: KNOWN_FAMILIES[name].hook_site(VERSION)[:2] for name in FAMILIES}


def _current(owner, attribute):
    return vars(owner)[attribute]


def test_install_wraps_each_family_once_keeping_its_signature():
    originals = {name: _current(*site) for name, site in _sites().items()}
    hooked = rr_transformers.install()
    assert set(hooked) == set(FAMILIES)
    assert rr_transformers.install() == hooked  # twice: nothing wrapped twice
    for name, (owner, attribute) in _sites().items():
        proxy = _current(owner, attribute)
        assert isinstance(proxy, RouterTopkProxy)
        assert proxy.__wrapped__ is originals[name]
        assert proxy.family is KNOWN_FAMILIES[name]
        assert inspect.signature(proxy) == inspect.signature(originals[name])
    assert rr_transformers.is_installed()
    assert rr_transformers.uninstall() == len(FAMILIES)
    assert rr_transformers.uninstall() == 0
    for name, (owner, attribute) in _sites().items():
        assert _current(owner, attribute) is originals[name]
    assert not rr_transformers.is_installed()


def test_uninstall_leaves_a_patch_made_over_rr_and_install_wraps_it():
    name = FAMILIES[0]
    owner, attribute = _sites()[name]
    original = _current(owner, attribute)
    rr_transformers.install()

    def theirs(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    setattr(owner, attribute, theirs)
    try:
        assert not rr_transformers.is_installed()
        rr_transformers.uninstall()
        assert _current(owner, attribute) is theirs  # not rr's: kept
        rr_transformers.install()
        assert _current(owner, attribute).__wrapped__ is theirs
        rr_transformers.uninstall()
        assert _current(owner, attribute) is theirs
    finally:
        setattr(owner, attribute, original)


def test_replay_through_a_foreign_wrapper_raises_instead_of_routing_natively():
    """Someone wrapped the router's forward after rr: their function reaches the family's code
    without rr's top-k, so an attached router must fail loudly, not replay nothing."""
    model_type = "qwen3_moe"
    owner, attribute = KNOWN_FAMILIES[model_type].hook_site(VERSION)[:2]
    original = _current(owner, attribute)

    def theirs(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    setattr(owner, attribute, theirs)
    try:
        rr_transformers.install()
        model = tiny_model(model_type)
        controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
        with pytest.raises(RouterHookError, match=r"layer 1 \(global .*0 routed top-k calls"):
            rr_transformers.attach(controller, model)  # attach's probe forward finds it
    finally:
        controller.detach()
        rr_transformers.uninstall()
        setattr(owner, attribute, original)


def test_attach_before_install_still_installs_for_one_release_with_a_warning():
    """rr_core's rule refuses attach before install; earlier releases of rr_transformers
    installed there, which keeps working for one release, warning at the caller's line."""
    model, controller = (
        tiny_model("qwen3_moe"),
        ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K),
    )
    assert not rr_transformers.is_installed()
    with pytest.warns(DeprecationWarning, match=r"call rr_transformers.install\(\) first") as got:
        attachment = rr_transformers.attach(controller, model)
    try:
        assert [w.filename for w in got] == [__file__]  # attributed to the caller
        assert rr_transformers.is_installed()
        assert attachment.layer_numbers == controller.layer_numbers != ()
    finally:
        controller.detach()
        rr_transformers.uninstall()


def test_a_refused_attach_before_install_leaves_nothing_installed():
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    with (
        pytest.warns(DeprecationWarning, match=r"install\(\) first"),
        pytest.raises(WalkError, match="not an MoE family"),
    ):
        rr_transformers.attach(controller, torch.nn.Linear(2, 2))  # no routers: refused
    assert not rr_transformers.is_installed()
    assert controller.layer_numbers == ()


def test_attach_after_the_hooks_were_replaced_since_install_raises():
    owner, attribute = KNOWN_FAMILIES["qwen3_moe"].hook_site(VERSION)[:2]
    rr_transformers.install()
    ours = _current(owner, attribute)
    setattr(owner, attribute, ours.__wrapped__)  # another library's patch dropped rr's hook
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    try:
        with pytest.raises(
            WalkError, match=r"no longer in place .* rr_transformers.install\(\) again"
        ):
            rr_transformers.attach(controller, tiny_model("qwen3_moe"))
        assert controller.layer_numbers == ()
    finally:
        rr_transformers.uninstall()
        setattr(owner, attribute, ours.__wrapped__)


def test_uninstall_leaves_no_rerouted_copy_of_a_family_function_behind():
    """The copy of each routing function whose globals see rr's top-k lives in rr's proxy
    only: once uninstall took the proxy out, nothing of rr's keeps the copy or its view of
    the modeling module's namespace."""
    owner, attribute = KNOWN_FAMILIES["qwen3_moe"].hook_site(VERSION)[:2]
    rr_transformers.install()
    view = weakref.ref(_current(owner, attribute)._self_rr_wrapper.rerouted.__globals__)
    assert view() is not None
    rr_transformers.uninstall()
    gc.collect()
    assert view() is None


def test_the_name_of_earlier_releases_still_answers_with_a_warning():
    rr_transformers.install()
    try:
        with pytest.warns(DeprecationWarning, match=r"call rr_transformers.is_installed\(\)"):
            assert rr_transformers.installed() is True
    finally:
        rr_transformers.uninstall()
    with pytest.warns(DeprecationWarning, match=r"rr_transformers.installed\(\) is deprecated"):
        assert rr_transformers.installed() is False


def test_install_refuses_a_routing_function_that_is_not_a_function():
    owner, attribute = _sites()[FAMILIES[0]]
    original = _current(owner, attribute)
    setattr(owner, attribute, staticmethod(original))
    try:
        with pytest.raises(RouterHookError, match=r"not the .* family's own function"):
            rr_transformers.install()
    finally:
        rr_transformers.uninstall()
        setattr(owner, attribute, original)


class InstallMachine(RuleBasedStateMachine):
    """Any sequence of install, uninstall and foreign patches: rr's proxies are in place exactly
    when rr says so, and every foreign patch survives rr."""

    def __init__(self) -> None:
        super().__init__()
        self.owner, self.attribute = _sites()[FAMILIES[0]]
        self.original = _current(self.owner, self.attribute)
        self.foreign: list[object] = []

    @rule()
    def install(self) -> None:
        rr_transformers.install()

    @rule()
    def uninstall(self) -> None:
        rr_transformers.uninstall()

    @rule(tag=st.integers(0, 3))
    def patch_over(self, tag: int) -> None:
        wrapped = _current(self.owner, self.attribute)

        def foreign(self_, *args, _w=wrapped, **kwargs):
            return _w(self_, *args, **kwargs)

        foreign.tag = tag  # type: ignore[attr-defined]
        setattr(self.owner, self.attribute, foreign)
        self.foreign.append(foreign)

    @precondition(lambda self: bool(self.foreign))
    @rule()
    def foreign_patch_is_never_removed_by_uninstall(self) -> None:
        rr_transformers.uninstall()
        current = _current(self.owner, self.attribute)
        assert not isinstance(current, RouterTopkProxy)
        assert current is self.foreign[-1]

    @invariant()
    def installed_means_proxies_in_place(self) -> None:
        if rr_transformers.is_installed():
            for owner, attribute in _sites().values():
                assert isinstance(_current(owner, attribute), RouterTopkProxy)

    def teardown(self) -> None:
        rr_transformers.uninstall()
        setattr(self.owner, self.attribute, self.original)


TestInstallMachine = InstallMachine.TestCase
TestInstallMachine.settings = settings(max_examples=40, stateful_step_count=12, deadline=None)
