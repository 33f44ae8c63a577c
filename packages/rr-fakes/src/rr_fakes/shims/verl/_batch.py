"""The TensorDict verl's Megatron engine consumes, a loss in the engine's signature, and one
step through ``forward_backward_batch``.

The layout is verl's no-padding (THD) one, as ``left_right_2_no_padding`` leaves it: jagged
``input_ids`` / ``position_ids`` of different lengths, ``response_mask`` (= ``loss_mask``)
right-padded to the longest response, a per-sample ``temperature`` tensor, and optional jagged
``routed_experts`` ``[B, j, L, K]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch


def _tu() -> Any:
    return importlib.import_module("verl.utils.tensordict_utils")


def _jagged(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)


def verl_batch(
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    vocab_size: int,
    *,
    seed: int = 0,
    temperature: float | Sequence[float] = 0.7,
    routed_experts: torch.Tensor | Sequence[torch.Tensor] | None = None,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    enable_routing_replay: bool = False,
    calculate_entropy: bool = False,
    extra: dict[str, Any] | None = None,
) -> Any:
    """A batch of ``len(prompt_lens)`` random sequences of ``prompt_lens[i] + response_lens[i]``
    tokens. Micro-batching: ``micro_batch_size`` sequences each (``use_dynamic_bsz=False``), or
    ``max_token_len`` tokens each (verl's dynamic batch size, which reorders sequences and then
    restores their order); one of the two. ``routed_experts`` is jagged ``[B, j, L, K]`` (or a
    list of ``[j_i, L, K]``), ``j`` = the sequence length, or one shorter for R3 rollout routes.
    ``extra`` adds non-tensor keys verbatim."""
    if len(prompt_lens) != len(response_lens) or not prompt_lens:
        raise ValueError("prompt_lens and response_lens must be non-empty and of equal length")
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("give exactly one of micro_batch_size and max_token_len")
    if min(prompt_lens) < 1 or min(response_lens) < 1:
        raise ValueError("every sequence needs a prompt token and a response token")
    generator = torch.Generator().manual_seed(seed)
    lengths = [p + r for p, r in zip(prompt_lens, response_lens, strict=True)]
    input_ids = [torch.randint(0, vocab_size, (n,), generator=generator) for n in lengths]
    batch = len(lengths)
    longest = max(response_lens)
    response_mask = torch.zeros(batch, longest, dtype=torch.int64)
    for i, r in enumerate(response_lens):
        response_mask[i, :r] = 1
    temps = [float(temperature)] * batch if isinstance(temperature, int | float) else temperature
    if len(temps) != batch:
        raise ValueError(f"{len(temps)} temperatures for {batch} sequences")
    tensors: dict[str, Any] = {
        "input_ids": _jagged(input_ids),
        "position_ids": _jagged([torch.arange(n) for n in lengths]),
        "response_mask": response_mask,
        "loss_mask": response_mask.clone(),
        "temperature": torch.tensor(list(temps), dtype=torch.float32),
    }
    if routed_experts is not None:
        if isinstance(routed_experts, torch.Tensor):
            if not routed_experts.is_nested:
                raise TypeError("routed_experts must be jagged, or a list of [j_i, L, K] tensors")
            routes = routed_experts
        else:
            routes = _jagged(routed_experts)
        if routes.shape[0] != batch:
            raise ValueError(f"routes for {routes.shape[0]} sequences, batch has {batch}")
        tensors["routed_experts"] = routes
    dataset = importlib.import_module("verl.utils.dataset.dataset_utils")
    non_tensor: dict[str, Any] = {
        "use_dynamic_bsz": max_token_len is not None,
        "pad_mode": dataset.DatasetPadMode.NO_PADDING,
        "enable_routing_replay": enable_routing_replay,
        "calculate_entropy": calculate_entropy,
    }
    if max_token_len is not None:
        non_tensor["max_token_len_per_gpu"] = max_token_len
    else:
        non_tensor["micro_batch_size_per_gpu"] = micro_batch_size
    non_tensor.update(extra or {})
    return _tu().get_tensordict(tensors, non_tensor)


def response_logprob_loss(
    model_output: dict[str, Any], data: Any, dp_group: Any = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A loss in verl's engine signature: minus the mean log-probability of the response tokens
    over the global batch (``batch_num_tokens``, as verl's own losses normalise; scaled by the
    data-parallel size, as verl's are). ``log_probs`` is jagged ``[b, j]``: row ``t`` holds the
    log-probability of token ``t + 1``."""
    tu = _tu()
    log_probs = model_output["log_probs"]
    lengths = data["input_ids"].offsets().diff().tolist()
    response_lens = data["response_mask"].sum(dim=-1).tolist()
    total = log_probs.values().new_zeros(())
    for row, length, response in zip(log_probs.unbind(), lengths, response_lens, strict=True):
        total = total + row[length - response - 1 : length - 1].sum()
    batch_tokens = tu.get_non_tensor_data(data, key="batch_num_tokens", default=None)
    dp_size = tu.get_non_tensor_data(data, key="dp_size", default=1)
    loss = -total / float(batch_tokens) * dp_size
    return loss, {"response_tokens": float(sum(response_lens))}


def run_step(engine: Any, data: Any, *, forward_only: bool, loss_function: Any = None) -> Any:
    """``engine.forward_backward_batch(data, loss, forward_only)`` with ``loss_function``
    (default :func:`response_logprob_loss`); returns verl's output dict, which on the last
    pipeline stage holds ``model_output["log_probs"]`` (jagged, in batch order) and, after an
    R2 record pass, ``model_output["routed_experts"]`` (jagged int16 ``[B, j, L_moe, K]``);
    it is empty on other stages. Parameters get gradients unless ``forward_only``."""
    loss = response_logprob_loss if loss_function is None else loss_function
    return engine.forward_backward_batch(data, loss, forward_only=forward_only)
