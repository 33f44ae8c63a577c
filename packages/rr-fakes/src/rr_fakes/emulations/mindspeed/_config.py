"""MindSpeed's config patches (``mindspeed/core/megatron_basic/arguments_basic.py``, read on
26.1.0_core_r0.12.1, core_r0.16.0, core_r0.17.0 and core_r0.18.0), and small stand-in classes.

- ``__init__`` wrapper: MindSpeed's global arguments updated with the keyword arguments are split
  by ``inspect.signature(self.__class__)`` into known and unknown; the instance's class is
  *always* replaced by ``dataclasses.make_dataclass(name, unknowns as init=False fields,
  bases=(class,))`` (module ``types`` on Python 3.11), each unknown value is set on the instance
  **before** the wrapped ``__init__`` runs, and only where ``not hasattr(self, name)``; then the
  wrapped ``__init__`` gets the known values.
- ``__post_init__`` wrapper: every feature's ``pre_validate_args`` / ``post_validate_args`` /
  ``validate_args`` run on the config, as on the command-line arguments. So a config built
  through the generated class (``dataclasses.replace``) lacks the unknown attributes and a
  feature's validation raises AttributeError; ``fix_router`` with EP=1 raises AssertionError.
- ``__init_subclass__`` (0.12 and 0.16 only): a subclass defined afterwards gets an annotation and
  a class default for every unknown global argument: a callable that is not a class becomes a
  ``default_factory``, a list / dict / set / bytearray ``default_factory=lambda: value``, which
  (as in MindSpeed's loop) returns whatever the loop variable held last, not that value.
- 0.16 only: a known key ``rope_type`` whose value is None is not passed on (``ignore_config``),
  so the class default stays; the other lines pass it.
- The generated class is named like the class; its module is ``types`` on Python 3.11 (where
  ``make_dataclass`` takes no module) and MindSpeed's ``arguments_basic`` module from 3.12 on.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from argparse import Namespace
from collections.abc import Callable, Sequence
from typing import Any

InitFunc = Callable[..., None]
ArgsFunc = Callable[[], Namespace]
ARGUMENTS_MODULE = "mindspeed.core.megatron_basic.arguments_basic"
_MUTABLE = (list, dict, set, bytearray)


def _generated_class(cls: type, fields: list[Any]) -> type:
    if sys.version_info < (3, 12):
        return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,))
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), module=ARGUMENTS_MODULE)


def make_config_patches(
    get_full_args: ArgsFunc, features: Callable[[], Sequence[Any]], line: str = "0.12"
) -> tuple[Callable[[InitFunc], InitFunc], Callable[[InitFunc], InitFunc], Callable[..., None]]:
    """The three functions MindSpeed registers on the config classes, over the emulation's
    global arguments and (live) feature list, as on MindSpeed ``line``."""
    ignored = ("rope_type",) if line == "0.16" else ()

    def transformer_config_init_wrapper(init: InitFunc) -> InitFunc:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            full_args = {**vars(get_full_args()), **kwargs}
            accepted = inspect.signature(self.__class__).parameters
            known = {
                k: v
                for k, v in full_args.items()
                if k in accepted and (v is not None or k not in ignored)
            }
            unknown = {k: v for k, v in full_args.items() if k not in accepted}
            fields = [
                (str(k), type(v), dataclasses.field(init=False))
                for k, v in unknown.items()
                if not hasattr(self, k)
            ]
            self.__class__ = _generated_class(self.__class__, fields)
            for key, value in unknown.items():
                if not hasattr(self, key):
                    setattr(self, key, value)
            init(self, *args, **known)

        return wrapper

    def transformer_config_post_init_wrapper(post_init: InitFunc) -> InitFunc:
        @functools.wraps(post_init)
        def wrapper(self: Any) -> None:
            for feature in features():
                feature.pre_validate_args(self)
            post_init(self)
            for feature in features():
                feature.post_validate_args(self)
            for feature in features():
                feature.validate_args(self)

        return wrapper

    def transformer_config_init_subclass(cls: type, **kwargs: Any) -> None:
        full_args = {**vars(get_full_args()), **kwargs}
        accepted = inspect.signature(cls).parameters
        unknown = {k: v for k, v in full_args.items() if k not in accepted}
        value: Any = None
        for key, value in unknown.items():
            if hasattr(cls, key):
                continue
            cls.__annotations__[key] = type(value)
            if callable(value) and not isinstance(value, type):
                value = dataclasses.field(default_factory=value)
            elif type(value) in _MUTABLE:
                value = dataclasses.field(default_factory=lambda: value)  # noqa: B023
            setattr(cls, key, value)

    return (
        transformer_config_init_wrapper,
        transformer_config_post_init_wrapper,
        transformer_config_init_subclass,
    )


@dataclasses.dataclass
class TransformerConfig:
    """Stand-in for megatron-core's ``TransformerConfig`` in torch-only tests: a dataclass
    whose ``num_attention_heads`` defaults to 0 and whose ``__post_init__`` divides by it, as
    the real one does when ``kv_channels`` is unset."""

    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    kv_channels: int | None = None
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_layer_freq: int | list[int] = 1
    moe_router_score_function: str = "softmax"
    moe_token_dispatcher_type: str = "allgather"
    moe_expert_capacity_factor: float | None = None
    moe_router_load_balancing_type: str = "aux_loss"
    moe_grouped_gemm: bool = False
    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    mtp_num_layers: int | None = None

    def __post_init__(self) -> None:
        if self.kv_channels is None:
            self.kv_channels = self.hidden_size // self.num_attention_heads


@dataclasses.dataclass
class MLATransformerConfig(TransformerConfig):
    """Stand-in for megatron-core's ``MLATransformerConfig`` (a ``TransformerConfig``
    subclass with its own generated ``__init__``)."""

    q_lora_rank: int | None = 512
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    rope_type: str = "yarn"
