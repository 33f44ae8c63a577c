"""The adapter: rr's hooks in verl's FSDP engine (see the package doc)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from packaging.version import InvalidVersion, Version

import rr_core.adapters as core
import rr_transformers
from rr_core import ReplayController, StepReport
from rr_core.verl_release import VerlReleaseError, check_verl_release
from rr_transformers.verl import _step
from rr_transformers.verl._binding import bind, existing, unbind
from rr_transformers.verl._errors import VerlFSDPReplayError
from rr_transformers.verl._supported import ENGINE_MODULE, HOOKS


def installed_verl_version() -> Version | None:
    """verl's release from its package metadata, or None when it is not installed."""
    from importlib import metadata

    try:
        return Version(metadata.version("verl"))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def _forward_backward_batch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    data = args[0] if args else kwargs["data"]
    forward_only = args[2] if len(args) > 2 else kwargs.get("forward_only", False)
    step = _step.begin(instance, data, bool(forward_only))
    if step is None:
        return wrapped(*args, **kwargs)
    try:
        output = wrapped(*args, **kwargs)
    except BaseException:
        _step.end(instance, step, failed=True)
        raise
    _step.end(instance, step, failed=False)
    if isinstance(output, dict) and isinstance(output.get("metrics"), dict) and step.metrics:
        output["metrics"].update(step.metrics)  # verl's worker logs them with its own
    return output


def _forward_step(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    step = _step.active(instance)
    if step is None:
        return wrapped(*args, **kwargs)
    micro_batch = args[0] if args else kwargs["micro_batch"]
    index = step.next_microbatch()
    controller = step.binding.controller
    if not step.record:
        device = next(instance.module.parameters()).device
        _step.arm(step, index, micro_batch, device)
    with controller.microbatch(index) as scope:
        loss, output = wrapped(*args, **kwargs)
        scope.track(loss)  # the backward (and its checkpoint recompute) is this micro-batch's
    if step.record:
        output["model_output"]["routed_experts"] = _step.recorded(step, index, micro_batch)
    return loss, output


class VerlFSDPAdapter(core.Adapter):
    """rr's routing replay in verl's FSDP engine, through rr_transformers' router hooks."""

    name = "verl-fsdp"
    module = "rr_transformers.verl"

    def __init__(self) -> None:
        super().__init__()
        self.owns_router_hooks = False  # install() put rr_transformers' hooks in: uninstall removes

    #: verl's module this side hooks: rr_megatron_compat.verl.install() installs the side
    #: when a process imports it.
    verl_modules = (ENGINE_MODULE,)

    def check_dependencies(self, *, force: bool) -> None:
        try:
            check_verl_release("rr's verl FSDP engine side", force=force)
        except VerlReleaseError as error:
            raise VerlFSDPReplayError(str(error)) from error

    def _install(self, *, force: bool) -> tuple[str, ...]:
        engine = importlib.import_module(ENGINE_MODULE)
        wrappers = {
            "forward_backward_batch": _forward_backward_batch,
            "forward_step": _forward_step,
        }
        for owner, method in HOOKS:
            self.patches.wrap(getattr(engine, owner), method, wrappers[method])
        if not rr_transformers.is_installed():
            rr_transformers.install()
            self.owns_router_hooks = True
        return tuple(f"{owner}.{method}" for owner, method in HOOKS)

    def _uninstall(self) -> int:
        removed = self.patches.restore()
        if self.owns_router_hooks:
            self.owns_router_hooks = False
            removed += rr_transformers.uninstall()
        return removed

    def _is_installed(self) -> bool:
        return self.patches.in_place() and rr_transformers.is_installed()

    def _attach(
        self, controller: ReplayController, model: Any, **options: Any
    ) -> rr_transformers.Attachment:
        self.install()
        return dataclasses.replace(bind(controller, model, **options).attachment, adapter=self.name)

    def _detach(self, controller: ReplayController) -> None:
        unbind(controller)


ADAPTER = VerlFSDPAdapter()


def last_report(model: Any) -> StepReport | None:
    """The report of the last replaying or recording pass of the engine whose model is
    ``model`` (``engine.module``), or None before its first."""
    binding = existing(model)
    return None if binding is None else binding.last_report


def controller_of(model: Any) -> ReplayController | None:
    """The controller driving ``model`` (``engine.module``): the one given to :func:`attach`,
    or the one rr made on its first pass; None before either."""
    binding = existing(model)
    return None if binding is None else binding.controller
