"""Every transformers fact of rr-transformers, as plain data with no imports: the supported
range (``rr doctor`` reads ``SUPPORTED``, entry point ``rr.supported``), the releases known to
break, the MoE families rr knows with where their top-k step lives and how each computes its
gate weights, the families it refuses, and the releases it is tested on (the test sessions
install them from the harness's pins, ``rr_fakes/pins.py``).

Why 5.0 is the floor: from 5.0 every family routes in a router module of its own (or, for the
grouped families before 5.13, in one method of the MoE block) whose top-k call rr can route;
4.x writes the top-k inline in each sparse block's ``forward``, which rr would have to copy.

Why there is no ceiling: a release newer than the newest tested line is not refused. rr warns
once, naming the newest tested release, and ``attach`` proves the hooks on the user's model
(:mod:`rr_transformers._probe`, which runs on tested releases too); a release known to break
is refused by name (``KNOWN_BROKEN``).
"""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"transformers": ">=5.0"}

#: The releases rr-transformers is tested on, oldest first (newest 5.x, and 5.0, the oldest with
#: router modules): the last is the newest tested release, and a newer one warns once and is
#: proven at attach. The transformers sessions install these (``TRANSFORMERS_LINES`` in
#: ``rr_fakes/pins.py``; tests/test_pins.py holds the two equal).
TESTED_RELEASES: tuple[str, ...] = ("5.0.0", "5.25.0")

#: Releases known to break replay (version specifier -> what breaks), refused by name at
#: install and attach. None is known today: every release up to the newest line passes the
#: transformers session.
KNOWN_BROKEN: dict[str, str] = {}

#: Per family (the text config's ``model_type``): the modeling module under
#: ``transformers.models``, the router class, the config attributes holding E and K, and the
#: router semantics as that family computes them (documentation, and what the tests check the
#: family's own code against):
#:   score: "softmax" | "sigmoid" (applied before the top-k) or "topk_softmax" (top-k on the
#:   logits, softmax over the K kept); normalise: True, False or the config attribute that
#:   decides; expert_bias: selection on score + e_score_correction_bias, weights without it;
#:   group_limited: top-k only inside the best topk_group of n_group expert groups;
#:   router_bias: the router's linear layer has a bias; scaling: config attribute multiplying
#:   the weights; since: the first release that has the family.
#: The router the Qwen-style families share: softmax scores, normalised as the config says.
_SOFTMAX: dict[str, object] = {
    "experts": "num_experts", "top_k": "num_experts_per_tok",
    "score": "softmax", "normalise": "norm_topk_prob",
}  # fmt: skip
#: DeepSeek-V3's router (and GLM-4 MoE's): sigmoid scores, expert bias, grouped top-k, scaled.
_GROUPED: dict[str, object] = {
    "experts": "n_routed_experts", "top_k": "num_experts_per_tok",
    "score": "sigmoid", "normalise": "norm_topk_prob", "expert_bias": True,
    "group_limited": True, "scaling": "routed_scaling_factor",
}  # fmt: skip
FAMILIES: dict[str, dict[str, object]] = {
    "qwen3_moe": {"module": "qwen3_moe", "router": "Qwen3MoeTopKRouter", **_SOFTMAX},
    "qwen3_next": {"module": "qwen3_next", "router": "Qwen3NextTopKRouter", **_SOFTMAX},
    "qwen3_5_moe_text": {
        "module": "qwen3_5_moe", "router": "Qwen3_5MoeTopKRouter",
        **_SOFTMAX, "normalise": True, "since": "5.2",
    },
    "qwen2_moe": {"module": "qwen2_moe", "router": "Qwen2MoeTopKRouter", **_SOFTMAX},
    "olmoe": {"module": "olmoe", "router": "OlmoeTopKRouter", **_SOFTMAX},
    "mixtral": {
        "module": "mixtral", "router": "MixtralTopKRouter",
        **_SOFTMAX, "experts": "num_local_experts", "normalise": True,
    },
    "gpt_oss": {
        "module": "gpt_oss", "router": "GptOssTopKRouter",
        "experts": "num_local_experts", "top_k": "num_experts_per_tok",
        "score": "topk_softmax", "normalise": False, "router_bias": True,
    },
    "deepseek_v3": {
        "module": "deepseek_v3", "router": "DeepseekV3TopkRouter", "block": "DeepseekV3MoE",
        **_GROUPED,
    },
    "glm4_moe": {
        "module": "glm4_moe", "router": "Glm4MoeTopkRouter", "block": "Glm4MoeMoE", **_GROUPED,
    },
}  # fmt: skip

#: Model types that run a known family's modeling code under a config of their own (model type
#: -> family). 5.25's Param2-MoE: ``Param2MoeConfig``, built as ``Glm4MoeForCausalLM`` by the
#: auto mappings; its routers are GLM-4-MoE's (one hook site, hooked once).
FAMILY_ALIASES: dict[str, str] = {"param2moe": "glm4_moe"}

#: MoE families rr refuses by name (``model_type`` -> why), rather than calling them unknown.
REFUSED_FAMILIES: dict[str, str] = {
    "ergo": (
        "ErgoTopkRouter selects with the tensor method `(scores + bias).topk(...)`, not "
        "`torch.topk`, so rr's routed top-k never sees the choice (transformers 5.25)"
    ),
}

#: Releases where the grouped families (those with a "block") select experts in the MoE block's
#: ``route_tokens_to_experts(router_logits)`` and the router returns logits only; from 5.13 the
#: router's ``forward`` selects, as in every other family.
ROUTE_IN_BLOCK: str = "<5.13"
ROUTE_IN_BLOCK_METHOD = "route_tokens_to_experts"
