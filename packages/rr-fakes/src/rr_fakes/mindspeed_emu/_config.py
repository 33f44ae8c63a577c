"""MindSpeed's per-instance TransformerConfig rebuild, and small stand-in config classes.

What it mirrors (``npu-facts.md``, "How MindSpeed rebuilds TransformerConfig"): a wrapper
around ``TransformerConfig.__init__`` (and ``MLATransformerConfig.__init__``) that

1. reads the accepted names from ``inspect.signature(self.__class__)``;
2. passes keyword arguments (and global arguments) with known names to the wrapped ``__init__``;
3. makes a new dataclass subclass *per instance* (``dataclasses.make_dataclass``, the original
   class as base, unknown names as ``init=False`` fields), assigns it to ``self.__class__`` and
   sets each unknown value only if ``not hasattr(self, name)``.

The consequences follow without being coded: the instance's class lives in module ``types``
(pickling fails), ``dataclasses.replace`` builds through the generated class and drops what was
set after construction, a wrapper without ``functools.wraps`` hides the real signature (every
field becomes unknown and the stand-in's ``__post_init__`` divides by zero attention heads), and
a class-level default wins over the value passed in.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

InitFunc = Callable[..., None]


def make_config_init_wrapper(
    global_args: Callable[[], Mapping[str, Any]],
) -> Callable[[InitFunc], InitFunc]:
    """The decorator MindSpeed registers on config ``__init__``; ``global_args`` returns
    MindSpeed's global arguments at construction time (explicit keywords win over them)."""

    def transformer_config_init_wrapper(init: InitFunc) -> InitFunc:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            accepted = list(inspect.signature(self.__class__).parameters)
            positional = set(accepted[: len(args)])
            known: dict[str, Any] = {}
            unknown: dict[str, Any] = {}
            for name, value in {**global_args(), **kwargs}.items():
                if name in accepted:
                    if name not in positional or name in kwargs:
                        known[name] = value
                else:
                    unknown[name] = value
            init(self, *args, **known)
            if not unknown:
                return
            rebuilt = dataclasses.make_dataclass(
                type(self).__name__,
                [(name, Any, dataclasses.field(init=False)) for name in unknown],
                bases=(type(self),),
            )
            rebuilt.__module__ = "types"
            self.__class__ = rebuilt
            for name, value in unknown.items():
                if not hasattr(self, name):
                    setattr(self, name, value)

        return wrapper

    return transformer_config_init_wrapper


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
