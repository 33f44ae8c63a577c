"""The emulated MindSpeed's config patches (arguments_basic.py): the per-instance generated
class, unknown values set before ``__init__``, validation and class defaults, on the stubs and
on the real megatron-core class."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
import sys
import types
from typing import Any

import pytest
from stub_targets import CONFIGS, STUBS, installed_line_or_none, tiny_config

from rr_fakes.emulations.mindspeed import (
    LINES,
    MLATransformerConfig,
    TransformerConfig,
    emulated_mindspeed,
)


# -- arguments_basic.py ---------------------------------------------------------------------------
@pytest.mark.parametrize("line", LINES)
def test_config_rebuild_structure(line: str, stub: types.ModuleType) -> None:
    with emulated_mindspeed(line=line, targets=STUBS, import_adaptor=True) as ms:
        cfg = tiny_config()  # no unknown keyword: rebuilt all the same (MindSpeed's flags)
        assert type(cfg) is not TransformerConfig
        assert type(cfg).__name__ == "TransformerConfig"
        if sys.version_info < (3, 12):
            assert type(cfg).__module__ == "types"
        assert cfg.moe_tp_extend_ep is False
        assert cfg.optimization_level == 2
        assert TransformerConfig.__init__.__wrapped__ is not None  # a wraps'd wrapper
        assert ms.patch(f"{CONFIGS}.TransformerConfig.__post_init__").wrappers
        with pytest.raises(AttributeError, match="moe_tp_extend_ep"):
            dataclasses.replace(cfg, num_layers=4)  # the generated class skips the rebuild
        cfg.set_later = 7
        assert copy.deepcopy(cfg).set_later == 7
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(cfg)
        subclass_defaults = line in ("0.12", "0.16")
        assert (f"{CONFIGS}.TransformerConfig.__init_subclass__" in ms.manager.patches_info) is (
            subclass_defaults
        )

        @dataclasses.dataclass
        class Later(TransformerConfig):
            pass

        assert (vars(Later).get("moe_tp_extend_ep", "absent") is False) is subclass_defaults
        mla_wrapped = f"{CONFIGS}.MLATransformerConfig.__init__" in ms.manager.patches_info
        assert mla_wrapped is (line != "0.17")


def test_unknown_values_are_set_before_init_and_class_defaults_win(
    stub: types.ModuleType,
) -> None:
    seen: dict[str, Any] = {}
    TransformerConfig.enable_routing_replay = False  # type: ignore[attr-defined]
    original = TransformerConfig.__post_init__

    def spying_post_init(self: Any) -> None:
        seen["use_fused_rotary"] = getattr(self, "use_fused_rotary", None)
        original(self)

    TransformerConfig.__post_init__ = spying_post_init  # type: ignore[method-assign]
    try:
        with emulated_mindspeed(line="0.16", targets=STUBS, args={"use_fused_rotary": True}):
            importlib.import_module("mindspeed.megatron_adaptor")
            cfg = tiny_config(enable_routing_replay=True)
            assert cfg.enable_routing_replay is False  # the class default wins
            assert seen == {"use_fused_rotary": True}  # already there inside __init__
    finally:
        TransformerConfig.__post_init__ = original  # type: ignore[method-assign]
        del TransformerConfig.enable_routing_replay  # type: ignore[attr-defined]


def test_unwrapped_init_dies_with_zero_heads(stub: types.ModuleType) -> None:
    with emulated_mindspeed(line="0.12", targets=STUBS, import_adaptor=True):
        assert tiny_config().kv_channels == 4
        mindspeed_init = TransformerConfig.__init__

        def careless_init(self: Any, *args: Any, **kwargs: Any) -> None:  # no functools.wraps
            mindspeed_init(self, *args, **kwargs)

        TransformerConfig.__init__ = careless_init  # type: ignore[method-assign]
        with pytest.raises(ZeroDivisionError):
            tiny_config()


def test_mla_accepts_unknown_flag_only_under_mindspeed(stub: types.ModuleType) -> None:
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with pytest.raises(TypeError):
        MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
    with emulated_mindspeed(line="0.12", targets=STUBS, import_adaptor=True):
        cfg: Any = MLATransformerConfig(enable_routing_replay=True, **kwargs)  # type: ignore[call-arg]
        assert cfg.enable_routing_replay is True
        assert isinstance(cfg, MLATransformerConfig)


def test_real_megatron_config_class_is_generated_per_instance() -> None:
    """Where megatron-core is installed: the rebuild on the real classes."""
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    if installed_line_or_none() is None:
        pytest.skip("no MindSpeed line for the installed megatron-core")
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with emulated_mindspeed(pre_patches=False, import_adaptor=True) as ms:
        cfg = tc.TransformerConfig(**kwargs)
        assert type(cfg) is not tc.TransformerConfig
        assert type(cfg).__module__ == "types"
        assert (
            tc.TransformerConfig.__init__.__wrapped__
            is ms.patch(
                "megatron.core.transformer.transformer_config.TransformerConfig.__init__"
            ).orig_func
        )
        with pytest.raises(AttributeError):
            dataclasses.replace(cfg, num_layers=4)
    assert type(tc.TransformerConfig(**kwargs)) is tc.TransformerConfig


# -- arguments_basic.py: the generated class ------------------------------------------------------
@pytest.mark.parametrize(("line", "rope_type"), [("0.12", None), ("0.16", "yarn"), ("0.18", None)])
def test_rope_type_none_is_dropped_only_on_016(
    line: str, rope_type: str | None, stub: types.ModuleType
) -> None:
    kwargs: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    with emulated_mindspeed(line=line, targets=STUBS, import_adaptor=True):
        assert MLATransformerConfig(rope_type=None, **kwargs).rope_type == rope_type


def test_subclass_defaults_for_mutable_values_are_the_last_loop_value(
    stub: types.ModuleType,
) -> None:
    args = {"layer_list": [1, 2], "zz_last": 5}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True):

        @dataclasses.dataclass
        class Later(TransformerConfig):
            pass

        later = Later(num_layers=2, hidden_size=8, num_attention_heads=2)
        assert later.zz_last == 5
        assert later.layer_list == 5  # MindSpeed's lambda reads its loop variable late
