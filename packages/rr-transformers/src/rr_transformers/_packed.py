"""The forward of a packed micro-batch must be the packed computation the routes were laid out
for.

transformers separates sequences packed in one row (``position_ids`` restarting at 0) only
when the decoder gets no 2D ``attention_mask`` and no KV cache (``masking_utils``: packing is
detected only then, in every release of the supported range). With ``use_cache`` on, which is
the config default of every MoE family, a cache is created, packing is not detected, and every
token attends to the sequences packed before it: the logits are another computation than the
padded one (a replayed packed batch then compares different forwards, silently).

So :func:`arm_routes` with ``position_ids`` registers the layout, and a pre-hook on the
attached model's decoder checks the forward of that micro-batch: ``use_cache`` left to the
config default is turned off (a training forward uses no cache; transformers does the same
under gradient checkpointing); ``use_cache=True``, a cache passed in, a 2D attention mask, and
``position_ids`` missing or other than the armed ones raise :class:`PackedForwardError` naming
the fix. Forwards of micro-batches armed padded, or not armed by rr_transformers, are left as
they are.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayMode
from rr_transformers._errors import PackedForwardError

#: Per controller, per micro-batch: (a weak reference to the routes tensor armed, position ids).
_PACKED: weakref.WeakKeyDictionary[ReplayController, dict[Hashable, tuple[Any, torch.Tensor]]]
_PACKED = weakref.WeakKeyDictionary()
#: Per decoder module: the guard's hook handle (one per module, the latest attachment's).
_GUARDS: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()
_CACHE_ARGS = ("past_key_values", "cache")  # the name before 5.24's rename, and after


def expect_packed(
    controller: ReplayController,
    microbatch: Hashable,
    routes_NLK: torch.Tensor,
    position_ids: torch.Tensor | None,
) -> None:
    """Remember how ``microbatch`` was armed: packed (its ``position_ids``), or not (None)."""
    armed = _PACKED.setdefault(controller, {})
    if position_ids is None:
        armed.pop(microbatch, None)
    else:
        armed[microbatch] = (weakref.ref(routes_NLK), position_ids.detach().flatten())


def forget_packed(controller: ReplayController) -> None:
    """Drop what :func:`expect_packed` remembers of ``controller``'s micro-batches."""
    _PACKED.pop(controller, None)


def _live_packed(controller: ReplayController) -> tuple[Hashable, torch.Tensor] | None:
    """The micro-batch whose forward runs now and its armed position ids, where rr_transformers
    armed it packed and its targets are still armed."""
    armed = _PACKED.get(controller)
    if not armed:
        return None
    current = getattr(controller, "_forward_mb", None)
    microbatch = 0 if current is None else current  # rr_core's DEFAULT_MICROBATCH
    entry = armed.get(microbatch)
    if entry is None:
        return None
    target = getattr(controller, "_armed", {}).get(microbatch)
    if target is None or getattr(target, "routes_TLK", None) is not entry[0]():
        armed.pop(microbatch, None)  # released, ended, or armed again by someone else
        return None
    layers = controller.layer_numbers
    if not any(controller.mode_of(layer) is ReplayMode.REPLAY for layer in layers):
        return None
    return microbatch, entry[1]


def guard_decoder(model: nn.Module, decoder: nn.Module, controller: ReplayController) -> None:
    """Check (and fix where it is only a default) every forward of ``decoder`` that runs a
    micro-batch ``controller`` holds packed."""
    previous = _GUARDS.pop(decoder, None)
    if previous is not None:
        previous.remove()
    names = [
        name
        for name, p in inspect.signature(decoder.forward).parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    owner = weakref.ref(controller)
    what = type(model).__name__

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctrl = owner()
        live = None if ctrl is None else _live_packed(ctrl)
        if live is None:
            return None
        microbatch, expected_N = live
        given = dict(zip(names, args, strict=False))
        given.update(kwargs)
        _check(what, microbatch, expected_N, given)
        if given.get("use_cache") is not None:
            return None
        if "use_cache" in names and names.index("use_cache") < len(args):
            args = (*args[: names.index("use_cache")], False, *args[names.index("use_cache") + 1 :])
        else:
            kwargs = {**kwargs, "use_cache": False}
        return args, kwargs

    _GUARDS[decoder] = decoder.register_forward_pre_hook(hook, with_kwargs=True)


def _check(
    what: str, microbatch: Hashable, expected_N: torch.Tensor, given: dict[str, Any]
) -> None:
    where = f"{what} forward of micro-batch {microbatch!r}, armed packed (position_ids)"
    if given.get("use_cache"):
        raise PackedForwardError(
            f"{where} runs with use_cache={given['use_cache']!r}: with a KV cache transformers "
            "does not detect the packed sequences and each token attends to the sequences "
            "packed before it (other logits than the padded batch). Pass use_cache=False"
        )
    cache = next((n for n in _CACHE_ARGS if given.get(n) is not None), None)
    if cache is not None:
        raise PackedForwardError(
            f"{where} was given a cache ({cache}=...): transformers then does not detect the "
            "packed sequences and they attend to each other. Pass no cache and use_cache=False"
        )
    mask = given.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        raise PackedForwardError(
            f"{where} was given a 2D attention_mask {list(mask.shape)}: transformers then does "
            "not detect the packed sequences and they attend to each other. Pass position_ids "
            "alone (no attention_mask), as flash-attention varlen packing does"
        )
    pos = given.get("position_ids")
    if not isinstance(pos, torch.Tensor):
        raise PackedForwardError(
            f"{where} was given no position_ids: the row is one long sequence to the model, "
            "not the packed sequences the routes were laid out for. Pass the position_ids "
            "given to arm_routes"
        )
    pos_N = pos.flatten()
    if pos_N.shape != expected_N.shape or not torch.equal(pos_N.to(expected_N.device), expected_N):
        raise PackedForwardError(
            f"{where} was given position_ids {list(pos.shape)} other than the "
            f"{expected_N.numel()} armed: the routes were laid out for another packing. Pass "
            "the position_ids given to arm_routes"
        )
