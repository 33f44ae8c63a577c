"""MindSpeed's pre-patches, per line: what ``RequirementsBasicFeature.pre_register_patches``
registers before Megatron is imported (``features_manager/megatron_basic/requirements_basic.py``
with the functions of ``core/megatron_basic/requirements_basic.py``, read on
26.1.0_core_r0.12.1 and core_r0.16.0).

- 0.12: ``torch.compile`` and ``torch.jit.script`` replaced by ``dummy_compile``;
  ``importlib.metadata.version`` wrapped to answer ``'2.2.0'`` for ``transformer-engine``;
  Transformer Engine, flash-attn and apex names created as dummy modules (``create_dummy``) and
  filled with MindSpeed's stand-ins or ``torch.nn.Module``; ``Tensor.type`` /
  ``Parameter.type`` wrapped to say ``cuda`` for ``npu``; ``Tensor.view`` wrapped to make its
  input contiguous; ``torch.distributed._all_gather_base`` / ``_reduce_scatter_base`` replaced
  by the ``*_tensor`` functions; ``all_reduce`` wrapped (float64 reduced as float32);
  ``torch._C._jit_set_nvfuser_enabled`` made a no-op; apex's fused optimizers replaced (and
  ``math.lcm`` only before Python 3.9, never here).
- 0.16: the same, plus ``torch.cuda.nvtx.range_push`` / ``range_pop`` (torch_npu's mstx),
  more Transformer Engine dummies (fp8, ops), fla / fast-hadamard dummies and
  ``torch.cuda.get_device_capability``.
- ``TransformerEngineBasicFeature`` (0.12 / 0.16) adds one: the dummy
  ``transformer_engine.pytorch.tensor.QuantizedTensor``, which Megatron's ``fp8_utils`` imports
  once the version answer says Transformer Engine 2.2 (its Megatron-side patches, on Megatron's
  TE extension classes, are not emulated: the CPU models use local specs).
- 0.17 / 0.18 register none: ``NpuEnhancementFeature.pre_register_patches`` is empty, and
  ``mindspeed/__init__.py`` imports the separate MegatronAdaptor (``megatron_adaptor``) first,
  which covers them (see :mod:`rr_fakes.emulations.mindspeed._adaptor`).

``dummy_compile`` has MindSpeed's shape: called with a function it returns a new ``wrapper``
closure (no ``functools.wraps``: name ``wrapper``, no ``__wrapped__``); called with options it
returns ``compile_wrapper``, which does the same to the function it gets. The stand-ins for
MindSpeed's NPU kernels (layer norm, optimizers, mstx ranges) compute on CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

Func = Callable[..., Any]


def dummy_compile(*args: Any, **kwargs: Any) -> Any:
    """MindSpeed's ``torch.compile`` / ``torch.jit.script``: no compiler, a new closure."""
    if args and callable(args[0]):
        fn = args[0]

        def wrapper(*fn_args: Any, **fn_kwargs: Any) -> Any:
            return fn(*fn_args, **fn_kwargs)

        return wrapper

    def compile_wrapper(fn: Func) -> Func:
        def wrapper(*fn_args: Any, **fn_kwargs: Any) -> Any:
            return fn(*fn_args, **fn_kwargs)

        return wrapper

    return compile_wrapper


def version_wrapper(fn: Func) -> Func:
    """``importlib.metadata.version`` answering ``'2.2.0'`` for ``transformer-engine``."""

    @functools.wraps(fn)
    def wrapper(name: str, *args: Any, **kwargs: Any) -> Any:
        return "2.2.0" if name == "transformer-engine" else fn(name, *args, **kwargs)

    return wrapper


def type_wrapper(fn: Func) -> Func:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        return result.replace("npu", "cuda") if isinstance(result, str) else result

    return wrapper


def ensure_contiguous_wrapper(fn: Func) -> Func:
    @functools.wraps(fn)
    def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(tensor if tensor.is_contiguous() else tensor.contiguous(), *args, **kwargs)

    return wrapper


def torch_all_reduce_double_dtype_bypass_wrapper(fn: Func) -> Func:
    """MindSpeed's ``all_reduce`` for float64: reduces a float32 copy and waits; as in its
    source, the reduced copy is not written back into the caller's tensor."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args and torch.is_tensor(args[0]) and args[0].dtype == torch.double:
            handle = fn(args[0].float(), *args[1:], **kwargs)
            if handle is not None:
                handle.wait()
            return None
        return fn(*args, **kwargs)

    return wrapper


def dummy_function(*args: Any, **kwargs: Any) -> None:
    """MindSpeed's no-op (``torch._C._jit_set_nvfuser_enabled``)."""


def multi_tensor_applier(op: Func, noop_flag_buffer: Any, tensor_lists: Any, *args: Any) -> Any:
    return op(noop_flag_buffer, tensor_lists, *args)


def multi_tensor_l2norm(overflow_buf: Any, tensor_lists: Any, per_parameter: bool) -> Any:
    norms = [torch.norm(g, 2.0) ** 2 for grads in tensor_lists for g in grads]
    total = torch.stack(norms).sum() if norms else torch.zeros(())
    return total.sqrt(), ([] if per_parameter else None)


def multi_tensor_scale(overflow_buf: Any, tensor_lists: Any, scale: float) -> None:
    if len(tensor_lists) != 2 or len(tensor_lists[0]) != len(tensor_lists[1]):
        raise AssertionError(
            f"multi_tensor_scale takes two lists of one length; got {tensor_lists}"
        )
    with torch.no_grad():
        for source, target in zip(*tensor_lists, strict=True):
            target.copy_(source * scale)


class Layernorm(torch.nn.LayerNorm):
    """Stand-in for MindSpeed's Transformer Engine ``LayerNorm`` (an NPU kernel)."""


def fused_layer_norm_affine(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, shape: Any, eps: float = 1e-5
) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, shape, weight, bias, eps)


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """Stand-in for MindSpeed's apex ``FusedLayerNormAffineFunction``."""

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, shape: Any, eps: float
    ) -> torch.Tensor:
        return fused_layer_norm_affine(x, weight, bias, shape, eps)


def npu_matmul_add(
    total_input: torch.Tensor, grad_output: torch.Tensor, grad: torch.Tensor
) -> None:
    """Stand-in for MindSpeed's ``npu_matmul_add_fp32`` / ``_fp16`` (wgrad accumulation)."""
    grad.add_(grad_output.t().matmul(total_input))


def range_start(message: str, *args: Any, **kwargs: Any) -> int:
    """Stand-in for ``torch_npu.npu.mstx.range_start`` (``torch.cuda.nvtx.range_push``)."""
    return 0


def range_end(*args: Any, **kwargs: Any) -> None:
    """Stand-in for ``torch_npu.npu.mstx.range_end`` (``torch.cuda.nvtx.range_pop``)."""


def get_device_capability(*args: Any, **kwargs: Any) -> tuple[int, int]:
    """Stand-in for MindSpeed's ``torch.cuda.get_device_capability`` (a fixed answer)."""
    return (9, 0)


def kernel_stand_in(name: str) -> Func:
    """A kernel MindSpeed brings for a name it creates (fla, fast-hadamard), never reached here."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name}: MindSpeed's NPU kernel, not emulated")

    kernel.__name__ = name.rpartition(".")[2]
    return kernel


_TE_012 = (
    "transformer_engine.pytorch.LayerNormLinear",
    "transformer_engine.pytorch.DotProductAttention",
    "transformer_engine.pytorch.Linear",
    "transformer_engine.pytorch.GroupedLinear",
    "transformer_engine.pytorch.distributed.CudaRNGStatesTracker",
    "transformer_engine.common.recipe.DelayedScaling",
)
_TE_016 = (
    "transformer_engine.pytorch.distributed.activation_recompute_forward",
    "transformer_engine.pytorch.fp8.fp8_autocast",
    "transformer_engine.pytorch.fp8.FP8GlobalStateManager",
    *(
        f"transformer_engine.pytorch.ops.{op}"
        for op in ("Sequential", "GELU", "GEGLU", "SwiGLU", "ReLU", "ReGLU", "FusibleOperation")
    ),
)


def register_pre_patches(pm: Any, line: str) -> None:
    """What ``RequirementsBasicFeature.pre_register_patches`` registers on ``line``, in its
    order (te, apex, torch, optimizer selection); nothing on 0.17 / 0.18."""
    if line not in ("0.12", "0.16"):
        return
    from torch.distributed import all_gather_into_tensor, reduce_scatter_tensor

    register = pm.register_patch
    # te_adaptation
    if line == "0.16":
        register("torch.cuda.nvtx.range_push", range_start)
        register("torch.cuda.nvtx.range_pop", range_end)
    register("torch.compile", dummy_compile)
    register("torch.jit.script", dummy_compile)
    register("importlib.metadata.version", version_wrapper)
    register("transformer_engine.pytorch.LayerNorm", Layernorm, create_dummy=True)
    for target in _TE_012 + (_TE_016 if line == "0.16" else ()):
        register(target, torch.nn.Module, create_dummy=True)
    register("flash_attn.flash_attn_interface.flash_attn_unpadded_func", create_dummy=True)
    if line == "0.16":
        for target in (
            "fla.modules.l2norm.l2norm",
            "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
            "fast_hadamard_transform.hadamard_transform",
        ):
            register(target, kernel_stand_in(target), create_dummy=True)
    # apex_adaptation
    register("amp_C.multi_tensor_l2norm", multi_tensor_l2norm, create_dummy=True)
    register("amp_C.multi_tensor_scale", multi_tensor_scale, create_dummy=True)
    register(
        "apex.multi_tensor_apply.multi_tensor_applier", multi_tensor_applier, create_dummy=True
    )
    register(
        "apex.normalization.fused_layer_norm.fused_layer_norm_affine",
        fused_layer_norm_affine,
        create_dummy=True,
    )
    register("fused_layer_norm_cuda", create_dummy=True)
    for suffix in ("fp32", "fp16"):
        register(
            f"fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_{suffix}",
            npu_matmul_add,
            create_dummy=True,
        )
    register(
        "apex.normalization.fused_layer_norm.FusedLayerNormAffineFunction",
        FusedLayerNormAffineFunction,
        create_dummy=True,
    )
    # torch_adaptation
    register("torch.nn.parameter.Parameter.type", type_wrapper)
    register("torch.Tensor.type", type_wrapper)
    register("torch.Tensor.view", ensure_contiguous_wrapper)
    register("torch.distributed._all_gather_base", all_gather_into_tensor)
    register("torch.distributed._reduce_scatter_base", reduce_scatter_tensor)
    register("torch.distributed.all_reduce", torch_all_reduce_double_dtype_bypass_wrapper)
    register("torch._C._jit_set_nvfuser_enabled", dummy_function)
    if line == "0.16":
        register("torch.cuda.get_device_capability", get_device_capability)
    # optimizer_selection (the default --optimizer-selection fused_adamw)
    register("apex.optimizers.FusedAdam", torch.optim.AdamW, create_dummy=True)
    register("apex.optimizers.FusedSGD", torch.optim.SGD, create_dummy=True)


def register_te_basic_pre_patches(pm: Any, line: str) -> None:
    """``TransformerEngineBasicFeature.pre_register_patches`` (0.12 / 0.16; none later)."""
    if line in ("0.12", "0.16"):
        pm.register_patch(
            "transformer_engine.pytorch.tensor.QuantizedTensor", torch.nn.Module, create_dummy=True
        )
