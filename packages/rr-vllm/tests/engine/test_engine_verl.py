"""A verl R3 step with rr on both sides and no other user code: the one line
``rr_megatron_compat.verl.install()`` (the rollout side from rr-vllm, the Megatron engine side
from rr-megatron-compat). The engine's answers (vLLM ``RequestOutput``s, as verl's
vLLM server reads them) go through verl 0.9.1's own agent-loop post-processing, its DataProto,
``to_tensordict`` and ``left_right_2_no_padding`` (the path of ``RayPPOTrainer``), into verl's
own ``MegatronEngineWithLMHead.forward_backward_batch`` on a real GPTModel shaped like the
engine's model. Every MoE router uses the engine's experts, in the forward and in the backward
recompute, and the step equals the one verl's own rollout path feeds the same trainer.

The answers come from the real engine (vLLM's CPU build on the tiny Qwen3-MoE checkpoint, a
float32 and a bfloat16 engine: every request it sent from the prompt's start, a prefix-cache
hit and a request cut at ``max_model_len`` included) and from rr_fakes' emulation of vLLM
0.22+'s answers, which the rest of rr's verl tests use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from rr_fakes.shims.megatron import unavailable_reason

if unavailable_reason():
    pytest.skip(f"megatron-core does not run here: {unavailable_reason()}", allow_module_level=True)

from rr_fakes.shims.verl import unavailable_reason as verl_unavailable

if verl_unavailable():
    pytest.skip(f"verl's engine does not run here: {verl_unavailable()}", allow_module_level=True)

from engine_rollouts import DTYPES, MAX_MODEL_LEN, rollout

import rr_fakes.shims.verl as vh
import rr_megatron_compat.verl as trainer_side
import rr_vllm.verl as rollout_side
from rr_fakes.emulations.engines import VllmEra, vllm_request_output
from rr_fakes.shims.megatron import TinyGPTConfig, model_parallel

#: The real rollout's requests verl sends as they are: from the prompt's start, one completion.
FAMILY = "qwen3_moe"


def emulated_answers(cfg: TinyGPTConfig) -> list[Any]:
    """One finished request per sample, as rr_fakes emulates vLLM 0.22+: ``T - 1`` rows on
    every decoder layer (the dense first layer's rows zero), uint8 ids."""
    routes = vh.rollout_routes(vh.LENGTHS, cfg.num_layers, cfg)
    generator = torch.Generator().manual_seed(1)
    answers = []
    for i, (p, g) in enumerate(zip(vh.PROMPTS, vh.RESPONSES, strict=True)):
        tokens = torch.randint(1, cfg.vocab_size, (p + g,), generator=generator).tolist()
        rows = routes[i].clone()
        rows[:, 0] = 0  # layer 1 is dense: vLLM's all-layers axis holds zeros there
        answers.append(
            vllm_request_output(
                VllmEra.V0_22,
                prompt_ids=tokens[:p],
                generated_ids=tokens[p:],
                routes_TLK=rows.numpy(),
                num_experts=cfg.num_experts,
                request_id=str(i),
                use_real_vllm=False,
            )
        )
    return answers


def qwen3_moe_config(cfg: TinyGPTConfig) -> Any:
    """The trainer's GPTModel as a Hugging Face config (what verl's model config holds)."""
    from transformers import Qwen3MoeConfig

    dense = [i for i, moe in enumerate(cfg.moe_layer_freq) if not moe]  # type: ignore[arg-type]
    return Qwen3MoeConfig(
        num_hidden_layers=cfg.num_layers,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.top_k,
        mlp_only_layers=dense,
        vocab_size=cfg.vocab_size,
    )


def agent_loop_batch(answers: list[Any], hf_config: Any) -> Any:
    """verl's agent-loop worker turning the engine's answers into the batch it returns:
    ``AgentLoopOutput`` per sample as its single-turn loop builds one, then
    ``_agent_loop_postprocess`` and ``_postprocess``."""
    from verl.experimental.agent_loop import agent_loop as al

    prompts = [len(a.prompt_token_ids) for a in answers]
    responses = [len(a.outputs[0].token_ids) for a in answers]
    worker = vh.agent_loop_worker(
        hf_config, prompt_length=max(prompts), response_length=max(responses)
    )
    outputs = [
        al.AgentLoopOutput(
            prompt_ids=list(a.prompt_token_ids),
            response_ids=list(a.outputs[0].token_ids),
            response_mask=[1] * len(a.outputs[0].token_ids),
            routed_experts=a.outputs[0].routed_experts,
            metrics=al.AgentLoopMetrics(),
        )
        for a in answers
    ]
    return vh.agent_loop_batch(worker, outputs)


def trainer_batch(proto: Any, samples: int) -> Any:
    """``RayPPOTrainer``'s conversion (``to_tensordict``, ``left_right_2_no_padding``) and the
    fields verl's engine worker adds before the engine's step."""
    from verl.trainer.ppo import ray_trainer
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode

    data = ray_trainer.left_right_2_no_padding(proto.to_tensordict())
    data["temperature"] = torch.full((samples,), 0.7)
    tu.assign_non_tensor(
        data,
        use_dynamic_bsz=False,
        pad_mode=DatasetPadMode.NO_PADDING,
        enable_routing_replay=True,
        calculate_entropy=False,
        micro_batch_size_per_gpu=1,
    )
    return data


def r3_step(answers: list[Any], hf_config: Any, cfg: TinyGPTConfig, *, rr_rollout: bool) -> Any:
    """verl's R3 step on ``answers``, with rr's rollout side installed or verl's own."""
    with vh.verl_cpu(), model_parallel():
        if rr_rollout:
            trainer_side.install()  # the one switch: every verl side, the rollout among them
        else:
            trainer_side.ADAPTER.install()  # the Megatron side alone: verl's own rollout path
        try:
            torch.manual_seed(0)
            chunks = vh.build_verl_chunks(cfg, mode="R3")
            engine = vh.verl_engine(chunks, mode="R3")
            proto = agent_loop_batch(answers, hf_config)
            stored = "routed_experts" in proto.batch.keys()  # noqa: SIM118 (a TensorDict)
            data = trainer_batch(proto, len(answers))
            vh.perturb(chunks)  # the trainer's own routing differs from the engine's
            with vh.route_log(chunks) as log:
                out = vh.run_step(engine, data, forward_only=False)
            used = {
                (r.layer_number, recompute): log.rows(r.layer_number, recompute=recompute)
                for r in vh.routers(chunks)
                for recompute in (False, True)
            }
            return {
                "used": used,
                "stored_int16": stored,
                "log_probs": out["model_output"]["log_probs"].values().detach(),
                "grads": torch.cat([r.weight.grad.flatten() for r in vh.routers(chunks)]),
            }
        finally:
            rollout_side.uninstall()
            trainer_side.uninstall()


def check_step(answers: list[Any], hf_config: Any, cfg: TinyGPTConfig) -> None:
    """rr's rollout side: every router of the step (forward and recompute) uses the engine's
    experts on every token the engine routed, and the step is the one verl's own path gives."""
    ours = r3_step(answers, hf_config, cfg, rr_rollout=True)
    assert not ours["stored_int16"]  # the agent loop's batch held rr's compact routes
    keep, engine_rows = [], []
    for a in answers:
        rows = torch.from_numpy(a.outputs[0].routed_experts).long()
        engine_rows.append(rows)
        keep += [True] * rows.shape[0] + [False]  # the last sampled token was never routed
    mask = torch.tensor(keep)
    assert len(ours["used"]) == 2 * sum(cfg.moe_layer_freq)  # type: ignore[arg-type]
    for (layer, recompute), used in ours["used"].items():
        target = torch.cat([r[:, layer - 1] for r in engine_rows]).sort(-1).values
        assert torch.equal(used.sort(-1).values[mask], target), (layer, recompute)
    theirs = r3_step(answers, hf_config, cfg, rr_rollout=False)
    assert theirs["stored_int16"]
    torch.testing.assert_close(ours["log_probs"], theirs["log_probs"], rtol=0, atol=0)
    torch.testing.assert_close(ours["grads"], theirs["grads"], rtol=0, atol=0)


def test_emulated_engine_answers() -> None:
    cfg = vh.tiny_config(recompute=True, freq=[0, 1, 1, 1])
    check_step(emulated_answers(cfg), qwen3_moe_config(cfg), cfg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_real_engine_answers(engines: Any, dtype: str) -> None:
    from transformers import AutoConfig

    roll = rollout(engines, FAMILY, dtype)
    answers = [o for r, o in zip(roll.requests, roll.outputs, strict=True) if not r.prompt_start]
    answers = [a for a in answers if len(a.outputs) == 1]
    assert {a.outputs[0].finish_reason for a in answers} >= {"length", "stop"}
    ckpt = roll.checkpoint
    freq = [int(n in ckpt.moe_layer_numbers) for n in range(1, ckpt.num_hidden_layers + 1)]
    cfg = dataclasses.replace(
        vh.tiny_config(recompute=True, freq=freq, num_layers=ckpt.num_hidden_layers),
        num_experts=ckpt.num_experts,
        top_k=ckpt.top_k,
        vocab_size=ckpt.vocab_size,
        max_sequence_length=MAX_MODEL_LEN,
    )
    check_step(answers, AutoConfig.from_pretrained(ckpt.path), cfg)
