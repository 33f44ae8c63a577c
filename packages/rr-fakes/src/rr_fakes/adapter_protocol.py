"""The contract of :mod:`rr_core.adapters`, as test classes every package's tests run over their
own adapters.

A package's test module subclasses :class:`InstallerContract` (an install-only adapter) or
:class:`AdapterContract` (both capabilities) under a ``Test`` name and gives it a ``case``
fixture yielding a :class:`ProtocolCase` (the adapter and a builder of a real model it drives,
inside whatever the framework needs: a model-parallel group for Megatron, which
:func:`megatron_case` gives). The tests are the same for every adapter, so an adapter that
breaks the protocol fails in its own package's session:

- install: idempotent (the same names, nothing wrapped twice), ``is_installed`` follows it,
  ``uninstall`` returns how many patches it took out (0 the second time), nothing of the
  adapter's left acting after it, a ``force`` that is not a bool refused;
- the policy toward other libraries: a patch laid over rr's hook is kept and rr's disabled in
  place (:class:`~rr_core.RRWarning`), a hook replaced since is wrapped again by ``install``;
- attach: before ``install()`` refused with :class:`~rr_core.adapters.NotInstalledError` (or,
  where the case says the adapter still installs there for one release, a DeprecationWarning),
  an :class:`~rr_core.adapters.Attachment` naming the adapter, ``detach`` releasing the routers,
  bad arguments refused naming what was expected.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import wrapt
from torch import nn

from rr_core import ReplayController, ReplayError, RRWarning
from rr_core.adapters import (
    Adapter,
    Attachment,
    Installer,
    NotInstalledError,
    adapters,
    leaked_patches,
)
from rr_core.patching import RRWrapper, raw_attribute, wrapper_chain

__all__ = ["AdapterContract", "InstallerContract", "ProtocolCase", "megatron_case"]


@dataclass
class ProtocolCase:
    """One adapter under the contract, with what it needs to drive a model."""

    adapter: Installer
    build: Callable[[], nn.Module] | None = None  # a real model with routers (attachers only)
    num_experts: int = 8
    top_k: int = 2
    #: ``attach`` before ``install()``: "raises" (the rule) or "deprecated" (an adapter that
    #: still installs there for one release, warning).
    attach_before_install: str = "raises"


@contextlib.contextmanager
def megatron_case(adapter: Installer, replay_fields: dict[str, Any]) -> Iterator[ProtocolCase]:
    """The case of an adapter that drives Megatron's ``TopKRouter``: a tiny real GPTModel whose
    config carries ``replay_fields`` (``rr_megatron_compat.replay_config_fields()``, the line's
    replay flag), built inside a model-parallel group; the adapter uninstalled on the way out."""
    from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, model_parallel

    with model_parallel():
        try:
            yield ProtocolCase(adapter, lambda: build_gpt(TinyGPTConfig(extra=dict(replay_fields))))
        finally:
            adapter.uninstall()


def _live_patches() -> list[tuple[Any, str]]:
    return [
        patch
        for adapter in adapters().values()
        if isinstance(adapter, Installer)
        for registry in adapter.registries()
        for patch in registry.live()
    ]


def _a_hook(adapter: Installer) -> tuple[Any, str]:
    """The adapter's first live patch that is one of rr's wrappers (a hook, not a replaced
    name); for an adapter that hooks through another's (rr_npu without MindSpeed), theirs."""
    own = [p for r in adapter.registries() for p in r.live()]
    return next(p for p in [*own, *_live_patches()] if isinstance(raw_attribute(*p), RRWrapper))


def _passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


class InstallerContract:
    """The install capability's contract; a subclass provides the ``case`` fixture."""

    def test_install_is_idempotent_and_uninstall_returns_what_it_removed(
        self, case: ProtocolCase
    ) -> None:
        adapter = case.adapter
        assert not adapter.is_installed()
        names = adapter.install()
        assert names
        assert all(isinstance(n, str) for n in names)
        assert adapter.is_installed()
        assert adapter.install_requested
        patched = _live_patches()
        assert adapter.install() == names  # again: nothing wrapped twice
        assert _live_patches() == patched
        removed = adapter.uninstall()
        assert isinstance(removed, int)
        assert removed >= 1
        assert not adapter.is_installed()
        assert not adapter.install_requested
        assert adapter.live_patches() == []
        assert adapter.uninstall() == 0
        assert leaked_patches() == {}

    def test_install_refuses_a_force_that_is_not_a_bool(self, case: ProtocolCase) -> None:
        with pytest.raises(ReplayError, match=r"install\(force=\.\.\.\) must be True or False"):
            case.adapter.install(force="yes")  # type: ignore[arg-type]
        assert not case.adapter.is_installed()

    def test_a_patch_laid_over_rrs_is_kept_and_rrs_hook_disabled(self, case: ProtocolCase) -> None:
        adapter = case.adapter
        adapter.install()
        owner, attribute = _a_hook(adapter)
        ours = raw_attribute(owner, attribute)
        theirs = wrapt.FunctionWrapper(ours, _passthrough)  # another library wraps rr's hook
        setattr(owner, attribute, theirs)
        try:
            with pytest.warns(RRWarning, match="wrapped again by another library"):
                adapter.uninstall()
            assert raw_attribute(owner, attribute) is theirs  # their patch stays
            rr = [w for w in wrapper_chain(theirs) if isinstance(w, RRWrapper)]
            assert rr
            assert not any(w.rr_active for w in rr)
            assert not adapter.is_installed()
        finally:
            setattr(owner, attribute, ours.__wrapped__)

    def test_a_hook_replaced_since_is_wrapped_again(self, case: ProtocolCase) -> None:
        adapter = case.adapter
        adapter.install()
        owner, attribute = _a_hook(adapter)
        ours = raw_attribute(owner, attribute)
        setattr(owner, attribute, ours.__wrapped__)  # another library's re-patch dropped rr's
        assert not adapter.is_installed()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            adapter.install()
        assert adapter.is_installed()
        assert raw_attribute(owner, attribute) is not ours
        assert adapter.uninstall() >= 1


class AdapterContract(InstallerContract):
    """Both capabilities' contract; a subclass provides the ``case`` fixture (with ``build``)."""

    @staticmethod
    def _attached(case: ProtocolCase) -> tuple[Adapter, nn.Module, ReplayController]:
        assert isinstance(case.adapter, Adapter)
        assert case.build is not None
        controller = ReplayController(num_experts=case.num_experts, top_k=case.top_k)
        return case.adapter, case.build(), controller

    def test_attach_returns_an_attachment_and_detach_releases(self, case: ProtocolCase) -> None:
        adapter, model, controller = self._attached(case)
        adapter.install()
        attachment = adapter.attach(controller, model)
        try:
            assert isinstance(attachment, Attachment)
            assert attachment.adapter == adapter.name
            assert attachment.layer_numbers == controller.layer_numbers != ()
            assert (attachment.num_experts, attachment.top_k) == (case.num_experts, case.top_k)
        finally:
            adapter.detach(controller)
        assert controller.layer_numbers == ()

    def test_attach_before_install_follows_the_one_rule(self, case: ProtocolCase) -> None:
        adapter, model, controller = self._attached(case)
        assert not adapter.install_requested
        if case.attach_before_install == "deprecated":
            with pytest.warns(DeprecationWarning, match=r"install\(\) first"):
                adapter.attach(controller, model)
            assert adapter.is_installed()
            adapter.detach(controller)
            return
        with pytest.raises(NotInstalledError, match=rf"{adapter.module}.install\(\)"):
            adapter.attach(controller, model)
        assert controller.layer_numbers == ()
        assert not adapter.is_installed()
        adapter.install()
        adapter.uninstall()
        with pytest.raises(NotInstalledError):  # and again once uninstalled
            adapter.attach(controller, model)
        assert controller.layer_numbers == ()

    def test_bad_arguments_are_refused_naming_what_was_expected(self, case: ProtocolCase) -> None:
        adapter, model, controller = self._attached(case)
        adapter.install()
        with pytest.raises(ReplayError, match=r"ReplayController as its controller; got .*str"):
            adapter.attach("controller", model)  # type: ignore[arg-type]
        with pytest.raises(ReplayError, match=r"torch.nn.Module .*; got .*int"):
            adapter.attach(controller, 3)
        with pytest.raises(ReplayError, match=r"ReplayController as its controller; got None"):
            adapter.detach(None)  # type: ignore[arg-type]
        assert controller.layer_numbers == ()
