"""What verl's job reads from disk, all made here: a tiny MoE checkpoint with a chat-ready
tokenizer, the RL dataset's parquet files, and the reward function's file.

verl's agent loop builds a Qwen "continuous token" builder from the checkpoint's
``model_type`` (``verl/utils/tokenizer/continuous_token.py:558``): ``"\\n"`` must be one token
and ``<|im_start|>`` / ``<|im_end|>`` must exist; ``RLHFDataset`` applies the tokenizer's chat
template to each prompt. rr_fakes' checkpoints have a word-level tokenizer with none of them,
so the checkpoint is copied with a ChatML tokenizer over the same vocabulary size.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

from rr_fakes.shims.hf_checkpoints import (
    VOCAB,
    HFCheckpoint,
    build_checkpoint,
    word_level_tokenizer,
)

#: The special tokens and words of the chat tokenizer, ids from 0; ``w{i}`` fill the rest.
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
WORDS = ("\n", "user", "assistant", "system")
#: ChatML as Qwen's templates render it (no system turn, no thinking block).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS, PROMPT_WORDS = 8, 6
REWARD_SOURCE = '''"""The job's reward: the share of the response's words with an even number
(``w{i}``), so responses of one prompt score differently and GRPO's advantages are not zero."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    words = [w for w in solution_str.split() if w[:1] == "w" and w[1:].isdigit()]
    return sum(int(w[1:]) % 2 == 0 for w in words) / max(len(words), 1)
'''


def _save_chat_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Sequence(
        [  # spaces separate words; a newline is a token of its own
            pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
            pre_tokenizers.Split("\n", behavior="isolated"),
        ]
    )
    fast = word_level_tokenizer(
        SPECIAL + WORDS,
        vocab_size,
        split,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / stale).unlink(missing_ok=True)
    fast.save_pretrained(path)


#: Per family, the config overrides of the Megatron engine's checkpoint: Megatron-Bridge 0.6.2
#: builds every Qwen3-MoE layer as MoE (``megatron/bridge/models/qwen/qwen3_moe_bridge.py``
#: ``provider_bridge`` reads neither ``mlp_only_layers`` nor ``decoder_sparse_step``; ``:47``
#: "All layers are MoE in Qwen3 MoE"), so the tiny checkpoint's dense layer 0 would become an
#: MoE layer with no weights from the checkpoint: another model than the engine's (and routes
#: for it that the engine never computed).
MEGATRON_OVERRIDES: dict[str, dict[str, Any]] = {"qwen3_moe": {"mlp_only_layers": []}}


def chat_checkpoint(family: str, root: Path, **overrides: Any) -> HFCheckpoint:
    """``family``'s tiny checkpoint (``rr_fakes.shims.hf_checkpoints``, ``overrides`` to its config)
    under ``root`` with the chat tokenizer: pad id 0, eos ``<|im_end|>`` (id 2), as the
    checkpoint's config has them."""
    source = build_checkpoint(family, **overrides)
    target = root / f"{source.path.name}-chat"
    if not (target / "rr_checkpoint.json").exists():
        scratch = root / f".{target.name}.tmp"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(source.path, scratch)
        _save_chat_tokenizer(scratch, VOCAB)
        scratch.rename(target)
    return HFCheckpoint(
        family=source.family,
        path=target,
        num_hidden_layers=source.num_hidden_layers,
        moe_layer_numbers=source.moe_layer_numbers,
        num_experts=source.num_experts,
        top_k=source.top_k,
        vocab_size=source.vocab_size,
    )


def dataset(root: Path, *, prompts: int = PROMPTS, seed: int = 0) -> tuple[Path, Path]:
    """The train and validation parquet files in the layout verl's ``RLHFDataset`` reads
    (``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth``)."""
    import pandas as pd

    rng = random.Random(seed)
    first = len(SPECIAL) + len(WORDS)
    rows = [
        {
            "data_source": "rr_verl_job",
            "prompt": [
                {
                    "role": "user",
                    "content": " ".join(
                        f"w{rng.randrange(first, VOCAB)}" for _ in range(PROMPT_WORDS)
                    ),
                }
            ],
            "ability": "words",
            "reward_model": {"style": "rule", "ground_truth": "even"},
            "extra_info": {"index": index},
        }
        for index in range(prompts)
    ]
    root.mkdir(parents=True, exist_ok=True)
    train, val = root / "train.parquet", root / "val.parquet"
    pd.DataFrame(rows).to_parquet(train)
    pd.DataFrame(rows[:2]).to_parquet(val)
    return train, val


def reward_file(root: Path) -> Path:
    """The reward function's file (verl's ``custom_reward_function.path``)."""
    path = root / "reward.py"
    path.write_text(REWARD_SOURCE)
    return path


def describe(checkpoint: HFCheckpoint) -> str:
    return json.dumps({"family": checkpoint.family, "path": str(checkpoint.path)})
