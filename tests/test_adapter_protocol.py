"""Every rr adapter keeps the one protocol of :mod:`rr_core.adapters`: install / uninstall /
is_installed / attach(controller, model) -> Attachment / detach, with the same argument order,
return types, idempotency, refusals and policy toward a patch laid over rr's.

Runs where every framework is installed at once (the verl session: real megatron-core, verl,
transformers); each adapter drives its own real model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import wrapt
from torch import nn

from rr_core import ReplayController, ReplayError, RRWarning
from rr_core.adapters import Adapter, Attachment, adapters, leaked_patches
from rr_core.patching import RRWrapper, raw_attribute, wrapper_chain
from rr_fakes.pytest_support import _no_leaked_attachments

__all__ = ["_no_leaked_attachments"]  # the shared leak check, active here too

NEEDS = ("megatron.core", "transformers", "verl")  # every framework an adapter drives
MISSING = [name for name in NEEDS if importlib.util.find_spec(name.split(".")[0]) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs {MISSING} (the verl session)")


@dataclass
class Case:
    adapter: Adapter
    build: Callable[[], nn.Module]
    num_experts: int
    top_k: int


@contextlib.contextmanager
def _megatron() -> Iterator[Callable[[], nn.Module]]:
    import rr_megatron_compat as rmc
    from rr_fakes.megatron import TinyGPTConfig, build_gpt, model_parallel

    with model_parallel():
        yield lambda: build_gpt(TinyGPTConfig(extra=rmc.replay_config_fields()))


@contextlib.contextmanager
def _transformers() -> Iterator[Callable[[], nn.Module]]:
    from rr_fakes.hf_models import tiny_model

    yield lambda: tiny_model("qwen3_moe")


def _adapter(module: str) -> Adapter:
    found = importlib.import_module(module).ADAPTER
    assert isinstance(found, Adapter)
    return found


#: adapter -> (its module, the framework it drives); the tiny models route top-2 of 8 experts.
CASES: dict[str, tuple[str, Callable[[], Any]]] = {
    "megatron": ("rr_megatron_compat", _megatron),
    "mindspeed": ("rr_npu", _megatron),  # rr_npu over plain Megatron (no MindSpeed loaded)
    "transformers": ("rr_transformers", _transformers),
    "verl": ("rr_megatron_compat.verl", _megatron),  # the drop-in for verl's Megatron engine
    "verl-fsdp": ("rr_transformers.verl", _transformers),  # verl's FSDP engine
}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    module, framework = CASES[request.param]
    adapter = _adapter(module)
    with framework() as build:
        try:
            yield Case(adapter, build, num_experts=8, top_k=2)
        finally:
            adapter.uninstall()


def _live_patches() -> list[tuple[Any, str]]:
    return [p for a in adapters().values() for r in a.registries() for p in r.live()]


def _a_hook(adapter: Adapter) -> tuple[Any, str]:
    """The adapter's first live patch that is one of rr's wrappers (a hook, not a replaced
    name); for an adapter that hooks through another's (rr_npu without MindSpeed), theirs."""
    own = [p for r in adapter.registries() for p in r.live()]
    return next(p for p in [*own, *_live_patches()] if isinstance(raw_attribute(*p), RRWrapper))


def test_install_is_idempotent_and_uninstall_returns_what_it_removed(case: Case) -> None:
    adapter = case.adapter
    assert not adapter.is_installed()
    names = adapter.install()
    assert names
    assert all(isinstance(n, str) for n in names)
    assert adapter.is_installed()
    patched = _live_patches()
    assert adapter.install() == names  # again: nothing wrapped twice
    assert _live_patches() == patched
    removed = adapter.uninstall()
    assert isinstance(removed, int)
    assert removed >= 1
    assert not adapter.is_installed()
    assert adapter.uninstall() == 0
    assert leaked_patches() == {}


def test_attach_returns_an_attachment_and_detach_releases(case: Case) -> None:
    adapter = case.adapter
    adapter.install()
    model = case.build()
    controller = ReplayController(num_experts=case.num_experts, top_k=case.top_k)
    attachment = adapter.attach(controller, model)
    try:
        assert isinstance(attachment, Attachment)
        assert attachment.adapter == adapter.name
        assert attachment.layer_numbers == controller.layer_numbers != ()
        assert (attachment.num_experts, attachment.top_k) == (case.num_experts, case.top_k)
    finally:
        adapter.detach(controller)
    assert controller.layer_numbers == ()


def test_bad_arguments_are_refused_naming_what_was_expected(case: Case) -> None:
    adapter = case.adapter
    adapter.install()
    model = case.build()
    controller = ReplayController(num_experts=case.num_experts, top_k=case.top_k)
    with pytest.raises(ReplayError, match=r"ReplayController as its controller; got .*str"):
        adapter.attach("controller", model)  # type: ignore[arg-type]
    with pytest.raises(ReplayError, match=r"torch.nn.Module .*; got .*int"):
        adapter.attach(controller, 3)
    with pytest.raises(ReplayError, match=r"ReplayController as its controller; got None"):
        adapter.detach(None)  # type: ignore[arg-type]
    with pytest.raises(ReplayError, match=r"install\(force=\.\.\.\) must be True or False"):
        adapter.install(force="yes")  # type: ignore[arg-type]
    assert controller.layer_numbers == ()


def _passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


def test_a_patch_laid_over_rrs_is_kept_and_rrs_hook_disabled(case: Case) -> None:
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


def test_a_hook_replaced_since_is_wrapped_again(case: Case) -> None:
    adapter = case.adapter
    adapter.install()
    owner, attribute = _a_hook(adapter)
    ours = raw_attribute(owner, attribute)
    setattr(owner, attribute, ours.__wrapped__)  # another library's re-patch dropped rr's hook
    assert not adapter.is_installed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapter.install()
    assert adapter.is_installed()
    assert raw_attribute(owner, attribute) is not ours
    assert adapter.uninstall() >= 1
