"""rr's CPU harness for megatron-core (and Megatron-Bridge) in the processes of a Megatron-engine
job: :func:`rr_fakes.shims.megatron.megatron_cpu` and
:func:`rr_fakes.shims.megatron.bridge_shims.bridge_cpu` entered for the rest of the process, at
the moment it first imports ``megatron``.

verl's Megatron engine imports megatron-core at module level and builds its model through
Megatron-Bridge; on this machine both need the harness in place before they import (megatron-core
0.18+ imports triton; bridge 0.6.2 imports ``typing.override``, Python 3.12+) and while they run
(CUDA streams, RNG tracker, Transformer Engine layer specs). A process that never imports
megatron (vLLM's engine core, the reward worker, ...) pays nothing: the import finder below
only wraps the loader of the top-level ``megatron`` package.

The harness's CUDA-to-CPU torch-function mode is thread-local: it is entered in the thread that
imports megatron, which in verl's Ray workers is the thread that runs the actor's methods.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

import torch
import wrapt
from torch.overrides import TorchFunctionMode

from rr_fakes.shims.verl_job.patches import check_release

#: Set by the harness for a Megatron-engine job (every process of the job inherits it).
ENV = "RR_VERL_JOB_MEGATRON"

#: The Megatron-Bridge releases the job's placeholders were checked on.
CHECKED_BRIDGE: tuple[str, ...] = ("0.6.2",)
#: verl's Megatron engine builds its DDP config with ``megatron.bridge.training.utils.
#: config_utils.create_ddp_config`` (``verl/utils/megatron_utils.py:445``; its fallback imports
#: the same module), whose ``megatron.bridge.training.config`` imports ``megatron.bridge.data``
#: and with it Energon's data module (``megatron/bridge/data/energon/
#: base_energon_datamodule.py:19``: ``from megatron.energon import ...``), a package of its own
#: (megatron-energon) that building and training a model never calls. Per importer, the
#: module that gets a placeholder where it is absent (rr_fakes' bridge harness's kind).
JOB_PLACEHOLDERS = {
    "megatron.bridge.data.energon.base_energon_datamodule": "megatron.energon",
}
#: What the job imports under :data:`JOB_PLACEHOLDERS` (verl imports it later, mid-build).
JOB_IMPORTS = ("megatron.bridge.training.config",)


#: The megatron-core releases :func:`_cuda_tensor_types` was checked on.
CHECKED_MEGATRON: tuple[str, ...] = ("0.19.2",)
#: megatron-core's mixed-precision optimizer sorts its parameters by ``param.type()``
#: (``megatron/core/optimizer/optimizer.py:1009,1028``: ``'torch.cuda.BFloat16Tensor'`` ...) and
#: refuses any other (``TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, ...
#: Received torch.BFloat16Tensor``); verl's Megatron engine takes bfloat16 only. Its gradient
#: clipping asserts the same of each main gradient (``clip_grads.py:174``, called by name from
#: ``optimizer.py:410,420``).
CUDA_TYPED = (
    ("megatron.core.optimizer.optimizer", "Float16OptimizerWithFloat16Params.__init__"),
    ("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32"),
)


class MegatronJobShimError(RuntimeError):
    """The job's Megatron harness met a Megatron-Bridge or megatron-core release it was not
    checked on."""


class _CudaTensorTypes(TorchFunctionMode):
    """``tensor.type()`` of a CPU tensor answers as the same tensor on CUDA would
    (``torch.cuda.BFloat16Tensor``); every other call is left as it is."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if func is _TENSOR_TYPE and len(args) == 1 and not kwargs and args[0].device.type == "cpu":
            return result.replace("torch.", "torch.cuda.", 1)
        return result


_TENSOR_TYPE = torch.Tensor.type


def _cuda_tensor_types(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    with _CudaTensorTypes():
        return wrapped(*args, **kwargs)


#: verl's Megatron engine module, and the method that builds its model chunks.
VERL_MEGATRON_ENGINE = "verl.workers.engine.megatron.transformer_impl"
BUILD = "MegatronEngine._build_megatron_module"


def _thd_attention(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """verl's engine packs each micro-batch's sequences into one row (``use_remove_padding``,
    its default: ``qkv_format="thd"``); Megatron's local ``DotProductAttention`` refuses packed
    input (``megatron/core/transformer/dot_product_attention.py:153``), which Transformer
    Engine's attention reads on a GPU. rr_fakes' THD attention takes its place in each layer
    of the chunks verl built (it holds no parameters: weight loading and export see the same
    names)."""
    from rr_fakes.shims.verl import use_thd_attention

    chunks = wrapped(*args, **kwargs)
    use_thd_attention(chunks)
    return chunks


def _resident_weights(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """verl's ``load_megatron_model_to_gpu`` (``verl/utils/megatron_utils.py:827``, called
    before every weight export, ``transformer_impl.py:1040``) restores each DDP buffer's
    ``param_data``, which megatron-core allocates for the distributed optimizer only: with
    ``use_distributed_optimizer=false`` it is None (``'NoneType' object has no attribute
    'storage'``). Those chunks' weights live in their parameters and were never offloaded
    (``param_offload=false``): nothing to load."""
    chunks = args[0] if args else kwargs["models"]
    for chunk in chunks:
        buffers = getattr(chunk, "buffers", None)
        if isinstance(buffers, list) and any(b.param_data is None for b in buffers):
            return None
    return wrapped(*args, **kwargs)


def _verl_engine(module: Any) -> None:
    wrapt.wrap_function_wrapper(module, BUILD, _thd_attention)
    wrapt.wrap_function_wrapper(module, "load_megatron_model_to_gpu", _resident_weights)


def check_megatron() -> None:
    """Refuse a megatron-core release :data:`CUDA_TYPED` was not checked on."""
    check_release(
        "megatron-core",
        CHECKED_MEGATRON,
        harness="rr_fakes.shims.verl_job.mcore",
        recheck="CUDA_TYPED against its source lines",
        error=MegatronJobShimError,
    )


_STACK = contextlib.ExitStack()


def check_bridge() -> None:
    """Refuse a Megatron-Bridge release :data:`JOB_PLACEHOLDERS` was not checked on."""
    check_release(
        "megatron-bridge",
        CHECKED_BRIDGE,
        harness="rr_fakes.shims.verl_job.mcore",
        recheck="JOB_PLACEHOLDERS against its importers",
        error=MegatronJobShimError,
    )


def _enter() -> None:
    """The harness, for the rest of this process (the ``ExitStack`` is never closed)."""
    from rr_fakes.shims.megatron import megatron_cpu

    bridge = importlib.util.find_spec("megatron.bridge") is not None
    if bridge:
        check_bridge()
    check_megatron()
    _STACK.enter_context(megatron_cpu())
    for module, name in CUDA_TYPED:
        wrapt.wrap_function_wrapper(module, name, _cuda_tensor_types)
    if not bridge:
        return
    from rr_fakes.shims.megatron.bridge_shims import _placeholders_for, bridge_cpu

    _STACK.enter_context(bridge_cpu())
    with _placeholders_for(JOB_PLACEHOLDERS):
        for name in JOB_IMPORTS:
            importlib.import_module(name)


class _Loader(importlib.abc.Loader):
    """The real loader of ``megatron`` (None: megatron-core and Megatron-Bridge share it as a
    namespace package); once the package has executed, the harness."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        if self.loader is None:
            return None
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if self.loader is not None:
            self.loader.exec_module(module)
        _enter()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``megatron`` once, as the other finders do, with :class:`_Loader` in front."""

    def find_spec(
        self, name: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "megatron":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def arm() -> None:
    """Enter the harness when this process first imports megatron (at once if it already has)."""
    wrapt.register_post_import_hook(_verl_engine, VERL_MEGATRON_ENGINE)
    if "megatron" in sys.modules:
        _enter()
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
