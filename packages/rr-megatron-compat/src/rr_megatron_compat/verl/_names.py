"""rr's own versions of the helpers verl's two router-replay modules import or define, under
verl's names and signatures (see :mod:`rr_megatron_compat.verl`): the drop-in calls them through
:data:`NAMES`, so replacing one on that module (a test, a hot-fix) changes what the drop-in does,
and the one object rr reads verl's names from (:class:`VerlNames`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Generic, NoReturn, TypeVar, overload

import torch

from rr_core import ReplayError, layer_offset
from rr_megatron_compat._layout import layout_config
from rr_megatron_compat._tokens import sp_scatter
from rr_megatron_compat._wire import all_gather_exact

#: verl's names for Megatron objects, loaded on first read: (module, attribute).
MEGATRON = {
    "mpu": ("megatron.core", "parallel_state"),
    "TopKRouter": ("megatron.core.transformer.moe.router", "TopKRouter"),
    "TransformerConfig": ("megatron.core.transformer.transformer_config", "TransformerConfig"),
    "get_schedule_table": ("megatron.core.pipeline_parallel.schedules", "get_schedule_table"),
    "is_vp_first_stage": ("megatron.core.pipeline_parallel.utils", "is_vp_first_stage"),
    "is_vp_last_stage": ("megatron.core.pipeline_parallel.utils", "is_vp_last_stage"),
    "MoEAlltoAllTokenDispatcher": (
        "megatron.core.transformer.moe.token_dispatcher",
        "MoEAlltoAllTokenDispatcher",
    ),
    "apply_router_token_dropping": (
        "megatron.core.transformer.moe.moe_utils",
        "apply_router_token_dropping",
    ),
    "compute_routing_scores_for_aux_loss": (
        "megatron.core.transformer.moe.moe_utils",
        "compute_routing_scores_for_aux_loss",
    ),
    "group_limited_topk": ("megatron.core.transformer.moe.moe_utils", "group_limited_topk"),
}
_MISSING = object()
T = TypeVar("T")


class _Name(Generic[T]):
    """One of verl's names, read as an attribute of :class:`VerlNames`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, names: None, owner: type) -> _Name[T]: ...
    @overload
    def __get__(self, names: VerlNames, owner: type) -> T: ...
    def __get__(self, names: VerlNames | None, owner: type) -> _Name[T] | T:
        return self if names is None else names.read(self.name)


class VerlNames:
    """The names of verl's two router-replay modules that rr calls, one attribute each.

    Each reads, in order: what replaced it in one of verl's router-replay modules since
    :func:`~rr_megatron_compat.verl.install` bound them (:meth:`bind`: so patching verl's module
    changes what the drop-in does, as it changes verl's own code); what replaced it on
    :mod:`rr_megatron_compat.verl` (:meth:`replace`); else rr's default: Megatron's object
    (:data:`MEGATRON`, imported on first read) or rr's function of that name (:meth:`provide`).
    """

    # Megatron's objects verl's modules import
    mpu: _Name[Any] = _Name()
    TopKRouter: _Name[type] = _Name()
    get_schedule_table: _Name[Callable[..., list[tuple[int, int]]]] = _Name()
    # rr's versions of verl's helpers (rr_megatron_compat.verl's functions)
    device_name: _Name[str] = _Name()
    get_device_name: _Name[Callable[[], str]] = _Name()
    _context_parallel_layout: _Name[Callable[[Any], str]] = _Name()
    scatter_to_sequence_parallel_region: _Name[Callable[..., torch.Tensor]] = _Name()
    gather_from_sequence_parallel_region: _Name[Callable[..., torch.Tensor]] = _Name()
    get_transformer_layer_offset: _Name[Callable[..., int]] = _Name()
    get_num_layers_to_build: _Name[Callable[..., int]] = _Name()
    get_current_rank_layer_info: _Name[Callable[..., dict[str, int]]] = _Name()
    is_moe_layer: _Name[Callable[[Any, int], bool]] = _Name()
    RouterReplayHelper: _Name[Any] = _Name()
    preprocess_packed_seqs: _Name[Callable[..., tuple[torch.Tensor, Any]]] = _Name()
    postprocess_packed_seqs: _Name[Callable[..., torch.Tensor]] = _Name()
    preprocess_thd_engine: _Name[Callable[..., tuple[torch.Tensor, Any, Any]]] = _Name()
    postprocess_thd_engine: _Name[Callable[..., torch.Tensor]] = _Name()

    def __init__(self) -> None:
        self._rr: dict[str, Any] = {}  # rr's functions, by verl's name (provide)
        self._replaced: dict[str, Any] = {}  # replaced on rr_megatron_compat.verl
        #: after install(): what each of verl's modules held under each name once rr's
        #: were in place (name -> [(module, value)]); a value there that is not this one was
        #: laid over it since (a test's monkeypatch, a user's hot-fix)
        self._as_installed: dict[str, list[tuple[ModuleType, Any]]] = {}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(n for n, v in vars(cls).items() if isinstance(v, _Name))

    def provide(self, **functions: Any) -> None:
        """rr's own object of each name (the package face hands its functions over)."""
        unknown = set(functions) - set(self.names())
        if unknown:
            raise TypeError(f"expected names of {self.names()}; got {sorted(unknown)}")
        self._rr.update(functions)

    def replace(self, name: str, value: Any) -> None:
        self._replaced[name] = value

    def restore(self, name: str) -> None:
        self._replaced.pop(name, None)

    def replaced_router_class(self) -> Any:
        """``TopKRouter`` where something replaced it on rr_megatron_compat.verl, else None
        (Megatron's is never imported for this)."""
        return self._replaced.get("TopKRouter")

    def bind(self, modules: list[ModuleType]) -> None:
        """Record verl's modules as install() left them."""
        self._as_installed = {}
        for name in self.names():
            held = [(m, vars(m)[name]) for m in modules if name in vars(m)]
            if held:
                self._as_installed[name] = held

    def unbind(self) -> None:
        self._as_installed = {}

    def read(self, name: str) -> Any:
        for module, installed in self._as_installed.get(name, ()):
            value = vars(module).get(name, _MISSING)
            if value is not _MISSING and value is not installed:
                return value
        if name in self._replaced:
            return self._replaced[name]
        if name in MEGATRON:
            return megatron_object(name)
        if name == "device_name":  # verl's module constant: the device, read when asked
            return self.get_device_name()
        return self._rr[name]


def megatron_object(name: str) -> Any:
    """Megatron's object verl's modules import as ``name`` (AttributeError where this line has
    none: verl's module lacks it there too, it only warns)."""
    module, attribute = MEGATRON[name]
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError as error:
        raise AttributeError(
            f"module 'rr_megatron_compat.verl' has no attribute {name!r}: this megatron-core has "
            f"no {module}.{attribute} ({error})"
        ) from error


#: The one object rr reads verl's names from.
NAMES = VerlNames()


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
    mpu = NAMES.mpu
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
        pp_rank = int(NAMES.mpu.get_pipeline_model_parallel_rank())
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
