"""The CPU harness: run real megatron-core on a machine without CUDA.

:func:`megatron_cpu` applies, only when CUDA is absent, the shims the installed line needs and
undoes them on exit. Every patch goes through one registry of ``(owner, attribute, original)``
so that exit restores exactly what was there, in reverse order. Each shim says what real
behaviour it stands in for.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from rr_core.patching import Patches
from rr_fakes.shims.megatron._flags import MegatronFlags, megatron_flags


# -- CUDA runtime stand-ins ----------------------------------------------------------------------
def _current_device() -> str:
    """Megatron passes ``torch.cuda.current_device()`` as ``device=`` (router gating, rotary
    embeddings); "cpu" makes those tensors land on the CPU."""
    return "cpu"


def _synchronize(device: Any = None) -> None:
    """Pipeline communication synchronises the device after p2p ops; on CPU gloo's ops have
    completed when they return."""


class _CpuStream:
    """CUDA streams order kernels on one GPU; the CPU runs ops in program order, so one stream
    that every wait / record / query accepts mirrors the observable behaviour. All instances
    compare equal, as the alltoall dispatcher compares its stream with the current one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CpuStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _CpuEvent:
        return event if isinstance(event, _CpuEvent) else _CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuEvent:
    """A CUDA event that has always completed (CPU ops are synchronous)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


_STREAM = _CpuStream()


def _current_stream(device: Any = None) -> _CpuStream:
    return _STREAM


def _stream(stream: Any = None) -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpuMode(TorchFunctionMode):
    """Megatron allocates some tensors with ``device="cuda"`` (the default causal mask, pipeline
    schedules' buffers) and moves others with ``.cuda()`` / ``.to("cuda")`` (0.12 - 0.13's
    schedule). On a GPU those land on the current device; here they land on the CPU."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # every torch call and tensor attribute read of the process passes here: the common
        # case (no device argument, not .cuda / .to) returns after two identity tests
        if func is _TENSOR_CUDA:
            return args[0]
        if not kwargs:
            kwargs = {}
        elif "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func is _TENSOR_TO:
            args = tuple("cpu" if _is_cuda(arg) else arg for arg in args)
        return func(*args, **kwargs)


_TENSOR_CUDA, _TENSOR_TO = torch.Tensor.cuda, torch.Tensor.to


def _split_sizes_as_lists(original: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's alltoall dispatcher passes split sizes as tensors (fine for NCCL); gloo's
    ``all_to_all_single`` accepts only lists there."""

    def all_to_all_single(
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Any = None,
        input_split_sizes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        def as_list(sizes: Any) -> Any:
            return sizes.tolist() if hasattr(sizes, "tolist") else sizes

        return original(
            output, input, as_list(output_split_sizes), as_list(input_split_sizes), *args, **kwargs
        )

    all_to_all_single.__wrapped__ = original  # type: ignore[attr-defined]
    return all_to_all_single


# -- megatron-side stand-ins ---------------------------------------------------------------------
def _triton_stub() -> types.ModuleType:
    """0.18+ import triton unconditionally in the MoE paged-stash kernels, which CPU runs never
    launch. The stub makes ``@triton.jit`` an identity and reports version 0.0.0, so modules
    that probe triton (fused indices / routing-map kernels) still choose their torch path."""
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.__spec__ = importlib.machinery.ModuleSpec("triton", None)
    language.__spec__ = importlib.machinery.ModuleSpec("triton.language", None)

    def jit(fn: Any = None, **kwargs: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    triton.__version__ = "0.0.0"  # type: ignore[attr-defined]
    triton.jit = jit  # type: ignore[attr-defined]
    triton.autotune = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
    triton.heuristics = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
    triton.Config = lambda *a, **k: None  # type: ignore[attr-defined]
    triton.cdiv = lambda a, b: -(-a // b)  # type: ignore[attr-defined]
    triton.language = language  # type: ignore[attr-defined]
    language.constexpr = lambda x: x  # type: ignore[attr-defined]

    def language_attribute(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return object  # dtypes and functions named in signatures and annotations

    language.__getattr__ = language_attribute  # type: ignore[method-assign]
    triton.__rr_fakes_stub__ = True  # type: ignore[attr-defined]
    return triton


def _identity(x: Any) -> Any:
    return x


def _warm_torch_compile() -> None:
    """torch probes ``import triton`` once (cached) and, when it succeeds, imports triton's
    compiler internals. Megatron decorates its fusions with ``torch.compile`` at import time,
    so that probe and those imports run here first, while triton is truly absent."""
    triton_utils = importlib.import_module("torch.utils._triton")
    triton_utils.has_triton_package()
    torch.compile(_identity)


def _cpu_rng_tracker_class() -> type:
    """Megatron forks a named RNG stream around dropout and expert init
    (``get_cuda_rng_tracker().fork()``), saving and restoring the *CUDA* generator. This
    tracker does the same with the CPU generator, which is the one CPU ops draw from."""
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    base: type = random.CudaRNGStatesTracker
    default_name = random._MODEL_PARALLEL_RNG_TRACKER_NAME

    class CpuRNGStatesTracker(base):  # type: ignore[misc]
        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)

        @contextlib.contextmanager
        def fork(self, name: str = default_name) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            original = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(original)

    return CpuRNGStatesTracker


def _get_cpu_rng_state(device: Any = -1, clone: bool = False, graph_safe: bool = False) -> Any:
    """Megatron's activation recompute (``tensor_parallel.checkpoint``) saves the *CUDA*
    generator's state before the forward and restores it around the recompute, so dropout
    draws the same masks twice. On CPU the ops draw from the CPU generator: save that one."""
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: Any, device: Any = -1, graph_safe: bool = False) -> None:
    """Counterpart of :func:`_get_cpu_rng_state` (Megatron's ``_set_cuda_rng_state``)."""
    torch.set_rng_state(new_state)


def _recompute_on_cpu(original: Any) -> Any:
    """The recompute runs inside autograd's backward, where the ``device="cuda"`` mapping
    (a TorchFunctionMode, inactive while torch dispatches ``backward`` through it) is not on
    the mode stack; the recomputed forward allocates on "cuda" like the first one did."""

    def backward(ctx: Any, *grads: Any) -> Any:
        with _CudaToCpuMode():
            return original(ctx, *grads)

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    return staticmethod(backward)


_TRACKER_CLASS: type | None = None
_depth = 0


def _apply(flags: MegatronFlags, patches: Patches) -> None:
    global _TRACKER_CLASS
    if flags.needs_triton and "triton" not in sys.modules:
        _warm_torch_compile()
        sys.modules["triton"] = _triton_stub()
        sys.modules["triton.language"] = sys.modules["triton"].language
    cuda = torch.cuda
    patches.set(cuda, "current_device", _current_device)
    patches.set(cuda, "synchronize", _synchronize)
    patches.set(cuda, "Stream", _CpuStream)
    patches.set(cuda, "Event", _CpuEvent)
    patches.set(cuda, "current_stream", _current_stream)
    patches.set(cuda, "stream", _stream)
    patches.set(dist, "all_to_all_single", _split_sizes_as_lists(dist.all_to_all_single))
    if flags.needs_te_gemm_name:
        moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
        if "te_general_gemm" not in vars(moe_utils):
            # Without TE the name is never bound, and the router's gating raises NameError.
            patches.set(moe_utils, "te_general_gemm", None)
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    if _TRACKER_CLASS is None:
        _TRACKER_CLASS = _cpu_rng_tracker_class()
    patches.set(random, "_CUDA_RNG_STATE_TRACKER", _TRACKER_CLASS())
    patches.set(random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)
    patches.set(random, "_get_cuda_rng_state", _get_cpu_rng_state)
    patches.set(random, "_set_cuda_rng_state", _set_cpu_rng_state)
    checkpoint = random.CheckpointFunction
    patches.set(checkpoint, "backward", _recompute_on_cpu(checkpoint.backward))
    # Cache the modules that import triton while the stub is in place (0.18+).
    for name in ("megatron.core.models.gpt.gpt_model", "megatron.core.pipeline_parallel"):
        importlib.import_module(name)


def _remove_triton_stub() -> None:
    stub = sys.modules.get("triton")
    if getattr(stub, "__rr_fakes_stub__", False):
        del sys.modules["triton"]
        sys.modules.pop("triton.language", None)


@contextlib.contextmanager
def megatron_cpu() -> Iterator[MegatronFlags]:
    """Run real megatron-core on CPU inside this context; yields the installed line's flags.

    With CUDA available nothing is patched. Nested entries share the outer one's shims.
    Import megatron modules inside the context (the triton stand-in exists only here; modules
    imported under it stay usable afterwards). Megatron's own activation recompute
    (``recompute_granularity``) saves and restores the CPU generator's state in place of the
    CUDA one.

    Megatron's ``jit_fuser`` functions (``torch.compile`` on torch 2.2+) run eagerly here:
    dynamo would trace this context's CUDA-to-CPU mode rather than Megatron's code (a GPU has
    no such mode) and recompile the mode per operator call, which was over half the time of a
    megatron-core test run. :func:`megatron_compiled` turns compilation back on.
    """
    global _depth
    flags = megatron_flags()
    if _depth or torch.cuda.is_available():
        _depth += 1
        try:
            yield flags
        finally:
            _depth -= 1
        return
    patches = Patches()
    mode = _CudaToCpuMode()
    _depth += 1
    try:
        _apply(flags, patches)
        with mode, torch._dynamo.config.patch(disable=True):
            yield flags
    finally:
        _depth -= 1
        _remove_triton_stub()
        patches.restore(force=True)  # whatever megatron changed since, put the process back


@contextlib.contextmanager
def megatron_compiled() -> Iterator[None]:
    """Inside :func:`megatron_cpu`, compile Megatron's ``jit_fuser`` functions as a GPU run
    does (for a test of rr under the compiled path)."""
    with torch._dynamo.config.patch(disable=False):
        yield


@functools.cache
def unavailable_reason() -> str | None:
    """Why megatron-core cannot be used in this process, or None when it can. The import runs
    inside :func:`megatron_cpu` (0.18+ cannot import megatron.core without the triton
    stand-in); cached per process, so spawned ranks check once each."""
    try:
        with megatron_cpu():
            importlib.import_module("megatron.core")
    except ImportError as error:
        return f"megatron-core unavailable: {error}"
    return None
