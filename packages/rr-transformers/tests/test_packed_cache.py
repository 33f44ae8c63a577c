"""A packed micro-batch's forward and the KV cache.

transformers keeps sequences packed in one row apart (``position_ids`` restarting at 0) only
without a KV cache and without a 2D attention mask; ``use_cache`` defaults to the config's
True, so a plain packed forward lets each sequence attend to the ones before it. What must
hold: a forward of a micro-batch armed packed computes the packed sequences apart (the
default ``use_cache`` is turned off: the same logits as the padded replay); ``use_cache=True``,
a cache, a 2D mask, and missing or other position ids raise ``PackedForwardError`` naming the
fix; padded micro-batches and forwards nobody armed packed are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the models are transformers models")

import rr_transformers
from rr_core import ReplayController, ReplayMode, RouteBatch, RouteMeta
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, VOCAB, tiny_model
from rr_transformers import PackedForwardError

LENGTHS = (7, 5, 9)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("qwen3_moe")


@pytest.fixture
def setup(model: Any) -> Iterator[tuple[Any, ReplayController, RouteBatch, dict[str, Any]]]:
    """The model attached, the routes of three sequences (recorded natively, padded), and the
    inputs of the padded and packed layouts."""
    torch.manual_seed(0)
    seqs = [torch.randint(3, VOCAB, (n,)) for n in LENGTHS]
    S = max(LENGTHS)
    ids_BS = torch.zeros(len(seqs), S, dtype=torch.int64)
    mask_BS = torch.zeros(len(seqs), S, dtype=torch.int64)
    for b, s in enumerate(seqs):
        ids_BS[b, : s.numel()] = s
        mask_BS[b, : s.numel()] = 1
    inputs = {
        "ids_BS": ids_BS,
        "mask_BS": mask_BS,
        "ids_1N": torch.cat(seqs)[None],
        "pos_1N": torch.cat([torch.arange(n) for n in LENGTHS])[None],
    }
    rr_transformers.install()
    controller = ReplayController(num_experts=NUM_EXPERTS, top_k=TOP_K)
    attachment = rr_transformers.attach(controller, model)
    try:
        controller.set_mode(ReplayMode.RECORD)
        with torch.no_grad(), controller.microbatch("native"):
            model(input_ids=ids_BS, attention_mask=mask_BS, use_cache=False)
        recorded = controller.recorded("native").view(len(seqs), S, -1, TOP_K)
        controller.end_step()
        layers = attachment.layer_numbers
        meta = RouteMeta(
            num_experts=NUM_EXPERTS,
            top_k=TOP_K,
            layer_axis="all_layers",
            layer_numbers=tuple(range(1, attachment.num_layers + 1)),
            moe_layer_numbers=layers,
        )
        values = []
        for b, n in enumerate(LENGTHS):
            v = torch.zeros(n, attachment.num_layers, TOP_K, dtype=torch.int64)
            v[:, [layer - 1 for layer in layers]] = recorded[b, :n].long()
            values.append(v)
        batch = RouteBatch.from_sequences(values, meta)
        controller.set_mode(ReplayMode.REPLAY)
        yield model, controller, batch, inputs
    finally:
        controller.detach()
        rr_transformers.uninstall()


def _padded_logits(setup: Any) -> torch.Tensor:
    model, controller, batch, x = setup
    rr_transformers.arm_routes(controller, "padded", batch, attention_mask=x["mask_BS"])
    with torch.no_grad(), controller.microbatch("padded"):
        logits = model(input_ids=x["ids_BS"], attention_mask=x["mask_BS"], use_cache=False).logits
    controller.end_step()
    return torch.cat([logits[b, :n] for b, n in enumerate(LENGTHS)])


def test_without_rr_a_packed_forward_with_the_cache_mixes_the_sequences(setup) -> None:
    model, controller, _, x = setup
    controller.set_mode(ReplayMode.OFF)
    with torch.no_grad():
        apart = model(input_ids=x["ids_1N"], position_ids=x["pos_1N"], use_cache=False).logits
        mixed = model(input_ids=x["ids_1N"], position_ids=x["pos_1N"]).logits  # config default
    first = LENGTHS[0]
    assert torch.allclose(apart[0, :first], mixed[0, :first], atol=1e-5)  # nothing before it
    assert float((apart[0, first:] - mixed[0, first:]).abs().max()) > 1e-2


def test_the_packed_replay_with_the_default_cache_is_the_padded_one(setup) -> None:
    model, controller, batch, x = setup
    padded = _padded_logits(setup)
    rr_transformers.arm_routes(controller, "packed", batch, position_ids=x["pos_1N"])
    with torch.no_grad(), controller.microbatch("packed"):
        out = model(input_ids=x["ids_1N"], position_ids=x["pos_1N"])  # use_cache not given
    controller.end_step()
    assert out.past_key_values is None  # the default was turned off
    assert float((out.logits[0] - padded).abs().max()) < 1e-5


def test_the_default_is_also_turned_off_for_positional_arguments(setup) -> None:
    model, controller, batch, x = setup
    padded = _padded_logits(setup)
    rr_transformers.arm_routes(controller, 0, batch, position_ids=x["pos_1N"])
    with torch.no_grad(), controller.microbatch(0):
        hidden = model.get_decoder()(x["ids_1N"], None, x["pos_1N"]).last_hidden_state
        logits = model.lm_head(hidden)
    controller.end_step()
    assert float((logits[0] - padded).abs().max()) < 1e-5


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"use_cache": True}, "use_cache=False"),
        ({"attention_mask": "ones"}, "2D attention_mask"),
        ({"position_ids": None}, "no position_ids"),
        ({"position_ids": "one sequence"}, "other than the"),
    ],
    ids=["use_cache", "2d-mask", "no-positions", "other-positions"],
)
def test_a_forward_that_cannot_keep_the_sequences_apart_raises(setup, change, match) -> None:
    model, controller, batch, x = setup
    kwargs: dict[str, Any] = {"input_ids": x["ids_1N"], "position_ids": x["pos_1N"]}
    for key, value in change.items():
        if value == "ones":
            value = torch.ones_like(x["ids_1N"])
        elif value == "one sequence":
            value = torch.arange(x["ids_1N"].shape[1])[None]
        kwargs[key] = value
    rr_transformers.arm_routes(controller, "packed", batch, position_ids=x["pos_1N"])
    with (
        torch.no_grad(),
        controller.microbatch("packed"),
        pytest.raises(PackedForwardError, match=match),
    ):
        model(**kwargs)
    controller.release("packed")


@pytest.mark.filterwarnings(
    "ignore:`past_key_values` is deprecated:FutureWarning"
)  # 5.24's name: cache
def test_a_cache_passed_in_raises(setup) -> None:
    from transformers import DynamicCache

    model, controller, batch, x = setup
    rr_transformers.arm_routes(controller, "packed", batch, position_ids=x["pos_1N"])
    cache = DynamicCache(config=model.config)
    with (
        torch.no_grad(),
        controller.microbatch("packed"),
        pytest.raises(PackedForwardError, match="cache"),
    ):
        model(input_ids=x["ids_1N"], position_ids=x["pos_1N"], past_key_values=cache)
    controller.release("packed")


def test_padded_and_unarmed_forwards_are_left_as_they_are(setup) -> None:
    model, controller, batch, x = setup
    rr_transformers.arm_routes(controller, "padded", batch, attention_mask=x["mask_BS"])
    with torch.no_grad(), controller.microbatch("padded"):
        out = model(input_ids=x["ids_BS"], attention_mask=x["mask_BS"])
    controller.end_step()
    assert out.past_key_values is not None  # the caller's default, untouched
    # a micro-batch armed packed, then ended: its id is no longer checked
    rr_transformers.arm_routes(controller, "packed", batch, position_ids=x["pos_1N"])
    controller.release("packed")
    controller.set_mode(ReplayMode.RECORD)
    with torch.no_grad(), controller.microbatch("packed"):
        out = model(input_ids=x["ids_1N"], position_ids=x["pos_1N"], use_cache=True)
    controller.end_step()
    assert out.past_key_values is not None
