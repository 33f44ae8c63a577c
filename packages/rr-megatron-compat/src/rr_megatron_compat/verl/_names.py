"""rr's own versions of the helpers verl's two router-replay modules import or define, under
verl's names and signatures (see :mod:`rr_megatron_compat.verl`): the drop-in calls them through
its module, so replacing one there (a test, a hot-fix) changes what the drop-in does."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any, NoReturn

import torch

import rr_megatron_compat.verl as surface
from rr_core import ReplayError, layer_offset
from rr_megatron_compat._layout import layout_config
from rr_megatron_compat._tokens import sp_scatter
from rr_megatron_compat._wire import all_gather_exact

#: After install(): what each of verl's two router-replay modules held under each of verl's
#: names once rr's were in place (name -> [(module, value)]). A value there that is not this
#: one was laid over it since: a test's monkeypatch, a user's hot-fix.
_AS_INSTALLED: dict[str, list[tuple[ModuleType, Any]]] = {}
_MISSING = object()


def current(name: str) -> Any:
    """What verl's ``name`` is now: whatever replaced it in one of verl's router-replay modules
    since :func:`~rr_megatron_compat.verl.install` (so patching verl's module changes what the
    drop-in does, as it would change verl's own code), else what :mod:`rr_megatron_compat.verl`
    holds (Megatron's object by default, or whatever replaced it there)."""
    for module, installed in _AS_INSTALLED.get(name, ()):
        value = vars(module).get(name, _MISSING)
        if value is not _MISSING and value is not installed:
            return value
    return getattr(surface, name)


def remember_as_installed(modules: list[ModuleType], names: Iterable[str]) -> None:
    """Record verl's modules as install() left them (see :data:`_AS_INSTALLED`)."""
    _AS_INSTALLED.clear()
    for name in names:
        held = [(m, vars(m)[name]) for m in modules if name in vars(m)]
        if held:
            _AS_INSTALLED[name] = held


def forget_as_installed() -> None:
    _AS_INSTALLED.clear()


def get_device_name() -> str:
    """The accelerator routes are moved to before the sequence-parallel collectives: ``cuda``,
    ``npu`` (torch_npu loaded), else ``cpu`` (verl's ``verl.utils.device.get_device_name``)."""
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def _context_parallel_layout(tf_config: Any) -> str:
    """verl's rule: DeepSeek-V4 hybrid attention splits contiguously, everything else zigzag
    (rr packs zigzag only, and refuses the other)."""
    if getattr(tf_config, "experimental_attention_variant", None) == "dsv4_hybrid":
        return "contiguous"
    return "zigzag"


def _tp(group: Any) -> tuple[int, int, Any]:
    mpu = current("mpu")
    if group is None:
        size = int(mpu.get_tensor_model_parallel_world_size())
        if size == 1:
            return 1, 0, None
        group = mpu.get_tensor_model_parallel_group()
    dist = torch.distributed
    return int(dist.get_world_size(group)), int(dist.get_rank(group)), group


def scatter_to_sequence_parallel_region(input_: torch.Tensor, group: Any = None) -> torch.Tensor:
    """This tensor-parallel rank's part of ``input_`` along dim 0 (Megatron's function of the
    same name, without autograd: route ids have no gradient)."""
    size, rank, _ = _tp(group)
    return input_ if size == 1 else sp_scatter(input_, rank, size)


def gather_from_sequence_parallel_region(
    input_: torch.Tensor, tensor_parallel_output_grad: bool = True, group: Any = None, **more: Any
) -> torch.Tensor:
    """Every tensor-parallel rank's part concatenated along dim 0, bit-exact for any integer
    dtype (Megatron's function of the same name, without autograd)."""
    size, _, tp_group = _tp(group)
    return input_ if size == 1 else torch.cat(all_gather_exact(input_.contiguous(), tp_group))


def get_transformer_layer_offset(
    config: Any, vp_stage: int | None = None, pp_rank: int | None = None
) -> int:
    """0-based first decoder layer of a pipeline rank's (this one's by default) virtual stage:
    rr-core's :func:`~rr_core.layer_offset`, equal to Megatron's function of the same name."""
    cfg = layout_config(config)
    vp = None if cfg.vp_size is None else (vp_stage or 0)
    if pp_rank is None:
        pp_rank = int(current("mpu").get_pipeline_model_parallel_rank())
    return layer_offset(cfg, pp_rank, vp)


def _refused(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise ReplayError(
            f"{name} is verl's replacement of Megatron's routing; under rr, Megatron's router "
            "calls rr's hook itself. Stage targets with set_router_replay_data(..., model=model) "
            "and run the model's forward"
        )

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused: verl's ``{name}`` (rr routes inside Megatron's router)."
    return refuse


patched_routing = _refused("patched_routing")
_patched_topk_routing_with_score_function = _refused("_patched_topk_routing_with_score_function")
_get_aux_loss_coeff = _refused("_get_aux_loss_coeff")
_is_aux_loss_enabled = _refused("_is_aux_loss_enabled")
