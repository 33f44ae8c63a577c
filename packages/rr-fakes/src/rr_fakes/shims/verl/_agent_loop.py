"""verl's own agent-loop post-processing, driven without Ray, a model server or a reward loop:
an ``AgentLoopWorker`` holding only what ``_agent_loop_postprocess`` and ``_postprocess`` read
(the tokenizer pads with id 0, no multi-modal processor, no distillation), and the batch those
two build from a list of ``AgentLoopOutput``, as the worker returns it to the trainer."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"


def agent_loop_worker(hf_config: Any = None, *, prompt_length: int, response_length: int) -> Any:
    """An ``AgentLoopWorker`` of the model ``hf_config`` (its ``model_config.hf_config``) padding
    prompts to ``prompt_length`` and responses to ``response_length``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    worker = object.__new__(importlib.import_module(AGENT_LOOP).AgentLoopWorker)
    worker.tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")),
        pad_token="[PAD]",
    )
    worker.processor = worker.mm_processor_kwargs = worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.model_config = SimpleNamespace(hf_config=hf_config)
    worker.rollout_config = SimpleNamespace(
        prompt_length=prompt_length, response_length=response_length
    )
    return worker


def agent_loop_batch(worker: Any, outputs: Sequence[Any]) -> Any:
    """verl's ``DataProto`` of ``outputs``: ``_agent_loop_postprocess`` per sample, then
    ``_postprocess``."""

    async def each() -> list[Any]:
        return [
            await worker._agent_loop_postprocess(o, validate=False, raw_prompt=[]) for o in outputs
        ]

    return worker._postprocess(asyncio.run(each()))
