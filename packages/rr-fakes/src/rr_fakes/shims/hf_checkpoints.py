"""Tiny Hugging Face checkpoints on disk, for tests that run a real rollout engine (vLLM) and a
real trainer (transformers) on the same weights.

A checkpoint is a directory that both load without any hub download: ``config.json``,
``model.safetensors`` (float32, in the family's original per-expert layout, as
``save_pretrained`` writes it), ``generation_config.json`` and a word-level tokenizer
(``tokenizer.json``; token ``i`` is the word ``w{i}``, 0-2 are ``<pad> <s> </s>``).

The sizes are the smallest the engine's CPU kernels accept: attention heads of 32 (vLLM's CPU
attention supports head sizes 32, 64, ...), and for DeepSeek-V3's multi-head latent attention a
latent of 512 + 64 (the only size its CPU decode kernel compiles for). Every family has 8
experts, top-2, four decoder layers, a dense first layer where the family has one.

The weights are drawn from a seed with ``initializer_range`` large enough that the model's next
token distribution is far from uniform, and the router weights at a scale that sets the spread
of the router logits (``router_logit_std``, in units of the logit's standard deviation over
tokens): large enough that most tokens' top-k is decisive, small enough that a few are near
ties that a bfloat16 forward resolves differently from a float32 one (as on real models).

Built checkpoints are cached under ``$RR_HF_CHECKPOINTS`` (default: a folder in the system's
temp dir), one folder per family and hash of everything that decides the weights (the config,
the seed, the scales, the transformers release), built in a scratch folder and renamed into
place, so concurrent builders never see a half-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rr_core import RouteMeta
from rr_fakes.shims import hf_models
from rr_fakes.shims.hf_models import routers_of

NUM_EXPERTS, TOP_K, HIDDEN, VOCAB = 8, 2, 64, 128
NUM_LAYERS = 4
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

#: vLLM's settings for serving these checkpoints on its CPU build, whatever the release: a 1 GiB
#: CPU KV cache, no OpenMP thread binding (a shared machine), the engine core in this process.
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
#: The variable that picks vLLM's V1 model runner (route capture on the CPU build needs it below
#: 0.31); vLLM 0.34 removed that runner and refuses the variable at start.
MODEL_RUNNER_VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"


def installed_vllm_release() -> str | None:
    """The installed vLLM release (``vllm`` or the CPU build ``vllm-cpu``), or None where none
    is: rr-vllm's own reader of the distributions' metadata."""
    from rr_vllm.releases import installed_vllm_version

    return installed_vllm_version()


def vllm_cpu_env(release: str | None = None) -> dict[str, str]:
    """:data:`VLLM_CPU_ENV`, plus ``VLLM_USE_V2_MODEL_RUNNER=0`` where ``release`` (default: the
    installed vLLM) still has the V1 model runner (``rr_vllm._supported.MODEL_RUNNER_V1``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from rr_vllm._supported import MODEL_RUNNER_V1

    env = dict(VLLM_CPU_ENV)
    release = release if release is not None else installed_vllm_release()
    if release is not None and Version(release) in SpecifierSet(MODEL_RUNNER_V1):
        env[MODEL_RUNNER_VARIABLE] = "0"
    return env


def set_vllm_cpu_env(release: str | None = None) -> None:
    """Set each of :func:`vllm_cpu_env` that is not set yet (vLLM reads them on import).

    Raises ValueError where the environment already asks for the V1 model runner and
    ``release`` (default: the installed vLLM) has none: vLLM would refuse to start."""
    release = release if release is not None else installed_vllm_release()
    env = vllm_cpu_env(release)
    asks_v1 = os.environ.get(MODEL_RUNNER_VARIABLE) == "0"
    if release is not None and MODEL_RUNNER_VARIABLE not in env and asks_v1:
        raise ValueError(
            f"{MODEL_RUNNER_VARIABLE}=0 is set, but vLLM {release} has no V1 model runner "
            f"(it refuses the variable): expected it unset, got "
            f"{os.environ[MODEL_RUNNER_VARIABLE]!r}"
        )
    for key, value in env.items():
        os.environ.setdefault(key, value)


_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 64,
    "num_hidden_layers": NUM_LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 32, "max_position_embeddings": 512, "num_experts_per_tok": TOP_K,
    "pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}  # fmt: skip

#: The grouped families' routing (8 experts in 4 groups, 2 kept), with wider experts.
_GROUPED: dict[str, Any] = {**hf_models._GROUPED, "moe_intermediate_size": 32}

#: Per family (its ``model_type``): what it adds to the common sizes. Each is a family that
#: vLLM's CPU path and transformers' modeling code both implement.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "num_experts": NUM_EXPERTS, "moe_intermediate_size": 32, "norm_topk_prob": True,
        "mlp_only_layers": [0],
    },
    "qwen2_moe": {  # a shared expert with its sigmoid gate beside the routed ones
        "num_experts": NUM_EXPERTS, "moe_intermediate_size": 32, "norm_topk_prob": False,
        "shared_expert_intermediate_size": 32, "mlp_only_layers": [0],
    },
    "mixtral": {"num_local_experts": NUM_EXPERTS},
    "olmoe": {"num_experts": NUM_EXPERTS, "norm_topk_prob": False},
    "glm4_moe": {  # DeepSeek-V3's router (sigmoid, expert bias, grouped top-k) without MLA;
        # top-4 of 4 groups, 2 kept: topk = 2 * topk_group, where Megatron's group scores (top
        # topk / group_topk per group) equal HF's and vLLM's (top 2 per group)
        **_GROUPED, "partial_rotary_factor": 0.5, "num_experts_per_tok": 4,
    },
    "deepseek_v3": {  # dense first layer, sigmoid scores, expert bias, grouped top-k, MLA
        **_GROUPED, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "num_key_value_heads": 2, "kv_lora_rank": 512, "q_lora_rank": 32,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 32, "v_head_dim": 32, "head_dim": 64,
        "rope_interleave": True, "num_experts_per_tok": 4,  # topk = 2 * topk_group (GLM-4-MoE)
    },
}  # fmt: skip

#: The families, in the order tests usually run them.
FAMILIES: tuple[str, ...] = tuple(FAMILY_CONFIGS)


@dataclass(frozen=True)
class HFCheckpoint:
    """A tiny checkpoint on disk and what a test needs to know of its routing."""

    family: str
    path: Path
    num_hidden_layers: int
    moe_layer_numbers: tuple[int, ...]  # global (1-based) numbers of the routed layers
    num_experts: int
    top_k: int
    vocab_size: int

    @property
    def dense_layer_numbers(self) -> tuple[int, ...]:
        return tuple(
            n for n in range(1, self.num_hidden_layers + 1) if n not in self.moe_layer_numbers
        )

    def route_meta(self) -> RouteMeta:
        """The all-layers axis the engine returns: one slot per decoder layer, dense slots
        empty."""
        return RouteMeta(
            num_experts=self.num_experts,
            top_k=self.top_k,
            layer_axis="all_layers",
            layer_numbers=tuple(range(1, self.num_hidden_layers + 1)),
            moe_layer_numbers=self.moe_layer_numbers,
        )

    def load_model(self, dtype: torch.dtype = torch.float32) -> Any:
        """The checkpoint as a transformers ``AutoModelForCausalLM`` in eval mode (eager
        attention, so every path runs on the CPU)."""
        from transformers import AutoModelForCausalLM

        auto: Any = AutoModelForCausalLM
        model = auto.from_pretrained(self.path, dtype=dtype, attn_implementation="eager")
        return model.eval()


def checkpoint_root() -> Path:
    """Where built checkpoints are cached: ``$RR_HF_CHECKPOINTS`` or a temp-dir folder."""
    env = os.environ.get("RR_HF_CHECKPOINTS")
    return Path(env) if env else Path(tempfile.gettempdir()) / "rr-hf-checkpoints"


def checkpoint_config(family: str, **overrides: Any) -> Any:
    """The transformers config of ``family`` (a key of :data:`FAMILY_CONFIGS`)."""
    from transformers import CONFIG_MAPPING

    if family not in FAMILY_CONFIGS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    kwargs = {**_COMMON, **FAMILY_CONFIGS[family], **overrides}
    return CONFIG_MAPPING[family](**kwargs)


def build_checkpoint(
    family: str,
    *,
    seed: int = 0,
    initializer_range: float = 0.15,
    router_logit_std: float = 2.0,
    expert_bias_scale: float = 0.1,
    root: Path | None = None,
    **overrides: Any,
) -> HFCheckpoint:
    """The tiny checkpoint of ``family``, built once per config and cached on disk.

    ``router_logit_std`` sets each router weight's standard deviation to
    ``router_logit_std / sqrt(hidden_size)``: the router sees RMS-normalised hidden states, so
    its logits spread about that much across tokens. ``expert_bias_scale`` bounds the uniform
    ``e_score_correction_bias`` of the families that have one (DeepSeek-V3). ``overrides`` go
    to the config.
    """
    import transformers

    config = checkpoint_config(family, initializer_range=initializer_range, **overrides)
    key: Mapping[str, Any] = {
        "config": config.to_dict(),
        "seed": seed,
        "router_logit_std": router_logit_std,
        "expert_bias_scale": expert_bias_scale,
        "transformers": transformers.__version__,
        "format": 1,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    path = (root or checkpoint_root()) / f"{family}-{digest[:16]}"
    info_path = path / "rr_checkpoint.json"
    if not info_path.exists():
        _build(config, path, seed, router_logit_std, expert_bias_scale)
    info = json.loads(info_path.read_text())
    return HFCheckpoint(
        family=family,
        path=path,
        num_hidden_layers=info["num_hidden_layers"],
        moe_layer_numbers=tuple(info["moe_layer_numbers"]),
        num_experts=info["num_experts"],
        top_k=info["top_k"],
        vocab_size=info["vocab_size"],
    )


def _build(
    config: Any, path: Path, seed: int, router_logit_std: float, expert_bias_scale: float
) -> None:
    from transformers import AutoModelForCausalLM

    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        torch.manual_seed(seed)
        auto: Any = AutoModelForCausalLM
        model = auto.from_config(config, dtype=torch.float32)
        std = router_logit_std / math.sqrt(config.hidden_size)
        moe_layers, num_experts = [], 0
        with torch.no_grad():
            for number, layer in enumerate(model.model.layers, start=1):
                routers = routers_of(layer)
                if routers:
                    moe_layers.append(number)
                for router in routers:
                    num_experts = router.weight.shape[0]
                    router.weight.normal_(0.0, std)
                    bias = getattr(router, "e_score_correction_bias", None)
                    if isinstance(bias, torch.Tensor):
                        bias.uniform_(-expert_bias_scale, expert_bias_scale)
        model.save_pretrained(scratch)
        _save_tokenizer(scratch, config.vocab_size)
        info = {
            "family": config.model_type,
            "num_hidden_layers": config.num_hidden_layers,
            "moe_layer_numbers": moe_layers,
            "num_experts": num_experts,
            "top_k": config.num_experts_per_tok,
            "vocab_size": config.vocab_size,
        }
        (scratch / "rr_checkpoint.json").write_text(json.dumps(info, indent=2))
        try:
            scratch.rename(path)
        except OSError:  # another builder got there first: its checkpoint is the same
            if not (path / "rr_checkpoint.json").exists():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def word_level_tokenizer(
    named: Sequence[str], vocab_size: int, pre_tokenizer: Any, **special: Any
) -> Any:
    """A word-level fast tokenizer: the ``named`` tokens first (ids from 0), then ``w{i}`` for
    every other id below ``vocab_size``, split into words by ``pre_tokenizer``, decoded as words
    joined with spaces; ``special`` (``unk_token`` among them) go to transformers'
    ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(named)}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=special["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)


def _save_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer: ``w{i}`` is token ``i``; what a tokenizer-less prompt of ids
    round-trips through."""
    from tokenizers import pre_tokenizers

    named = ("<pad>", "<s>", "</s>")  # PAD_ID, BOS_ID, EOS_ID
    fast = word_level_tokenizer(
        named,
        vocab_size,
        pre_tokenizers.WhitespaceSplit(),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<pad>",
    )
    fast.save_pretrained(path)


def prompt_text(token_ids: list[int]) -> str:
    """The text the checkpoint's tokenizer turns into ``token_ids`` (ids >= 3)."""
    if any(t < 3 for t in token_ids):
        raise ValueError(f"ids 0-2 are special tokens and have no word: {token_ids}")
    return " ".join(f"w{t}" for t in token_ids)
