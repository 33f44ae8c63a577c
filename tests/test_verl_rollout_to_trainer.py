"""A verl R3 step with rr on both sides and no other user code: ``rr_vllm.verl.install()`` and
``rr_megatron_compat.verl.install()``. The engine's answers (vLLM's ``RequestOutput``, as verl's
vLLM server reads them) go through verl 0.9.1's own agent-loop post-processing, its DataProto,
``to_tensordict`` and ``left_right_2_no_padding`` (the path of ``RayPPOTrainer``), into verl's own
``MegatronEngineWithLMHead.forward_backward_batch`` on a tiny real GPTModel. Every MoE router
uses the engine's experts, in the forward and in the backward recompute, and the step equals
the one verl's own rollout path feeds the same trainer.

Runs where verl and megatron-core import (the ``verl`` nox session)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rr_fakes.megatron import model_parallel
from rr_fakes.megatron import unavailable_reason as megatron_reason

REASON = megatron_reason()
if REASON is None:
    from rr_fakes.verl import unavailable_reason as verl_reason

    REASON = verl_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

if REASON is None:
    import rr_fakes.verl as vh
    import rr_megatron_compat.verl as trainer_side
    import rr_vllm.verl as rollout_side
    from rr_fakes.engines import VllmEra, vllm_request_output


def engine_answers(cfg: Any) -> list[Any]:
    """One finished vLLM request per sample: ``T - 1`` rows on every decoder layer (the dense
    first layer's rows zero), uint8 ids as vLLM 0.22+ returns them."""
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


def agent_loop_batch(answers: list[Any], cfg: Any) -> Any:
    """verl's agent-loop worker turning the engine's answers into the batch it returns:
    ``AgentLoopOutput`` per sample as its single-turn loop builds one, then
    ``_agent_loop_postprocess`` and ``_postprocess`` on a worker holding what those read."""
    from transformers import Qwen3MoeConfig
    from verl.experimental.agent_loop import agent_loop as al

    worker = vh.agent_loop_worker(
        Qwen3MoeConfig(  # the trainer's GPTModel as a Hugging Face config
            num_hidden_layers=cfg.num_layers,
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.top_k,
            mlp_only_layers=[0],
        ),
        prompt_length=max(vh.PROMPTS),
        response_length=max(vh.RESPONSES),
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


def trainer_batch(proto: Any) -> Any:
    """``RayPPOTrainer``'s conversion (``to_tensordict``, ``left_right_2_no_padding``) and the
    fields verl's engine worker adds before the engine's step."""
    from verl.trainer.ppo import ray_trainer
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode

    data = ray_trainer.left_right_2_no_padding(proto.to_tensordict())
    data["temperature"] = torch.full((len(vh.PROMPTS),), 0.7)
    tu.assign_non_tensor(
        data,
        use_dynamic_bsz=False,
        pad_mode=DatasetPadMode.NO_PADDING,
        enable_routing_replay=True,
        calculate_entropy=False,
        micro_batch_size_per_gpu=1,
    )
    return data


def r3_step(*, rr_rollout: bool) -> dict[str, Any]:
    with vh.verl_cpu(), model_parallel():
        trainer_side.install()
        if rr_rollout:
            rollout_side.install()
        try:
            cfg = vh.tiny_config(recompute=True, freq=[0, 1, 1, 1])
            torch.manual_seed(0)
            chunks = vh.build_verl_chunks(cfg, mode="R3")
            engine = vh.verl_engine(chunks, mode="R3")
            answers = engine_answers(cfg)
            proto = agent_loop_batch(answers, cfg)
            stored = "routed_experts" in proto.batch.keys()  # noqa: SIM118 (a TensorDict)
            data = trainer_batch(proto)
            vh.perturb(chunks)  # the trainer's own routing differs from the engine's
            with vh.route_log(chunks) as log:
                out = vh.run_step(engine, data, forward_only=False)
            used = {
                (r.layer_number, recompute): log.rows(r.layer_number, recompute=recompute)
                for r in vh.routers(chunks)
                for recompute in (False, True)
            }
            return {
                "answers": answers,
                "used": used,
                "stored_int16": stored,
                "log_probs": out["model_output"]["log_probs"].values().detach(),
                "grads": torch.cat([r.weight.grad.flatten() for r in vh.routers(chunks)]),
            }
        finally:
            rollout_side.uninstall()
            trainer_side.uninstall()


def test_every_router_uses_the_engines_experts_and_the_step_is_verls() -> None:
    ours = r3_step(rr_rollout=True)
    assert not ours["stored_int16"]  # the agent loop's batch held rr's compact routes
    keep, engine_rows = [], []
    for a in ours["answers"]:
        rows = torch.from_numpy(a.outputs[0].routed_experts).long()
        engine_rows.append(rows)
        keep += [True] * rows.shape[0] + [False]  # the last sampled token was never routed
    mask = torch.tensor(keep)
    for (layer, recompute), used in ours["used"].items():
        target = torch.cat([r[:, layer - 1] for r in engine_rows]).sort(-1).values
        assert torch.equal(used.sort(-1).values[mask], target), (layer, recompute)
    theirs = r3_step(rr_rollout=False)
    assert theirs["stored_int16"]
    torch.testing.assert_close(ours["log_probs"], theirs["log_probs"], rtol=0, atol=0)
    torch.testing.assert_close(ours["grads"], theirs["grads"], rtol=0, atol=0)
