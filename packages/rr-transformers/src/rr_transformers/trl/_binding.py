"""The controller that replays each model TRL runs forward (the policy, a reference model).

A model gets its controller on its first replayed forward (E and top-k from its config). A
step of a controller spans the forwards TRL runs between two calls of ``training_step``'s end:
forward-only passes (old log-probs, the reference model) close their step when they return,
the training forward's step closes after its backward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from torch import nn

import rr_transformers
from rr_core import ReplayController, StepReport
from rr_transformers._families import family_of, text_config
from rr_transformers._versions import checked_version


@dataclass
class Binding:
    controller: ReplayController
    layer_numbers: tuple[int, ...]
    microbatches: int = 0  # in the open step
    reports: list[tuple[str, StepReport]] = field(default_factory=list)  # not yet logged

    def next_microbatch(self) -> int:
        index, self.microbatches = self.microbatches, self.microbatches + 1
        return index


_BINDINGS: weakref.WeakKeyDictionary[nn.Module, Binding] = weakref.WeakKeyDictionary()


def binding_for(model: nn.Module) -> Binding:
    """``model``'s binding; a new controller attached to it when it has none."""
    found = _BINDINGS.get(model)
    if found is None:
        num_experts, top_k = family_of(model, checked_version()).sizes(text_config(model.config))
        controller = ReplayController(num_experts=num_experts, top_k=top_k)
        attachment = rr_transformers.attach(controller, model)
        found = _BINDINGS[model] = Binding(controller, tuple(attachment.layer_numbers))
    return found


def bindings() -> list[Binding]:
    return list(_BINDINGS.values())


def open_bindings() -> list[Binding]:
    """The bindings with a step in progress (armed micro-batches not yet closed)."""
    return [b for b in list(_BINDINGS.values()) if b.microbatches]


def release_all() -> None:
    """Detach every controller rr made (at uninstall): their models route natively again."""
    for model, binding in list(_BINDINGS.items()):
        del _BINDINGS[model]
        rr_transformers.detach(binding.controller)
