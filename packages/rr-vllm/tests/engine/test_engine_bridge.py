"""R3 on the real engine into the GPTModel Megatron-Bridge converts the engine's checkpoint into
(``AutoBridge.from_hf_pretrained``, bridge's own weight mapping: ``rr_fakes.hf_to_megatron``),
for each family bridge converts (``BRIDGE_FAMILIES``: its checkpoint, where bridge needs one
shaped as the family's releases are, is rolled out by the engine too).

What must hold, per family: bridge's model computes what rr's loader and transformers compute on
the same checkpoint (every router's native picks equal to the loader's, logits within 1e-4);
under replay every (token, MoE layer) the engine routed goes to the engine's experts (float32
and bfloat16 engine); natively it routes as a float32 engine does. The families bridge has no
converter for are named, and checked to be absent from bridge's registry.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

pytest.importorskip("rr_megatron_compat", reason="rr-megatron-compat is not installed")

from rr_fakes.shims.megatron.bridge_shims import unavailable_reason

if unavailable_reason():
    pytest.skip(
        f"Megatron-Bridge does not run here: {unavailable_reason()}", allow_module_level=True
    )

from engine_megatron import MegatronFigures, expect_exact_replay, register_summary
from engine_megatron import figures as megatron_figures
from engine_rollouts import DTYPES, expect_float32_routing, rollout, trainer_model

from rr_fakes.hf_to_megatron import BRIDGE_FAMILIES, BRIDGE_UNSUPPORTED
from rr_fakes.shims.hf_checkpoints import build_checkpoint
from rr_fakes.shims.hf_models import right_padded

FAMILIES = list(BRIDGE_FAMILIES)
KEYS = [(f, d) for d in DTYPES for f in FAMILIES]  # dtype-major: each engine once


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> None:
    register_summary(request)


def _variant(family: str) -> str:
    return json.dumps(dict(BRIDGE_FAMILIES[family].checkpoint), sort_keys=True)


def _figures(engines: Any, family: str, dtype: str, build: str = "bridge") -> MegatronFigures:
    return megatron_figures(engines, family, dtype, build, _variant(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_bridge_converts_the_checkpoint_as_rr_loader_and_transformers(
    engines: Any, family: str
) -> None:
    converted = _figures(engines, family, "float32")
    loaded = _figures(engines, family, "float32", "rr loader")
    assert sorted(converted.native_ids) == sorted(loaded.native_ids)
    for layer, ids in converted.native_ids.items():
        assert torch.equal(ids, loaded.native_ids[layer]), f"layer {layer} routes differently"
    assert converted.logits_native is not None
    assert loaded.logits_native is not None
    torch.testing.assert_close(converted.logits_native, loaded.logits_native, atol=1e-4, rtol=0)

    roll = rollout(engines, family, "float32", variant=json.loads(_variant(family)))
    tokens = [p + g for p, g, _ in roll.sequences()]
    ids_BS, mask_BS = right_padded(tokens)
    with torch.no_grad():
        hf = trainer_model(roll.checkpoint)(input_ids=ids_BS, attention_mask=mask_BS).logits
    valid = mask_BS.bool()
    torch.testing.assert_close(converted.logits_native[valid], hf[valid], atol=1e-4, rtol=0)


@pytest.mark.parametrize(("family", "dtype"), KEYS)
def test_bridge_replay_sends_every_routed_token_to_the_engines_experts(
    engines: Any, family: str, dtype: str
) -> None:
    roll = rollout(engines, family, dtype, variant=json.loads(_variant(family)))
    expect_exact_replay(_figures(engines, family, dtype), roll.checkpoint)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_float32_engine_routes_as_bridges_gpt_model(engines: Any, family: str) -> None:
    expect_float32_routing(_figures(engines, family, "float32"), family)


@pytest.mark.parametrize("family", BRIDGE_UNSUPPORTED)
def test_bridge_has_no_converter_for(family: str) -> None:
    from transformers import AutoConfig

    from rr_fakes.shims.megatron.bridge_shims import bridge_cpu

    config = AutoConfig.from_pretrained(build_checkpoint(family).path)
    with bridge_cpu():
        from megatron.bridge import AutoBridge

        supported = AutoBridge.list_supported_models()
    assert not set(config.architectures) & set(supported)
