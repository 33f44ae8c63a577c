"""Which controller drives each verl FSDP engine's model, and what its last pass reported.

A model attached with :func:`rr_transformers.verl.attach` keeps the caller's controller; an
engine whose model nobody attached gets its own on its first replaying pass (E and top-k from
the model's config), so that installing is the one line a trainer needs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from torch import nn

import rr_transformers
from rr_core import ReplayController, StepReport
from rr_transformers._families import family_of, text_config
from rr_transformers._versions import checked_version


@dataclass
class Binding:
    controller: ReplayController
    attachment: rr_transformers.Attachment
    last_report: StepReport | None = None

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return self.attachment.layer_numbers

    @property
    def num_layers(self) -> int:
        return int(self.attachment.num_layers)


_BINDINGS: weakref.WeakKeyDictionary[nn.Module, Binding] = weakref.WeakKeyDictionary()


def bind(controller: ReplayController, model: nn.Module, **options: Any) -> Binding:
    attachment = rr_transformers.attach(controller, model, **options)
    assert isinstance(attachment, rr_transformers.Attachment)
    binding = Binding(controller, attachment)
    _BINDINGS[model] = binding
    return binding


def binding_for(model: nn.Module) -> Binding:
    """``model``'s binding; a new controller attached to it when it has none."""
    found = _BINDINGS.get(model)
    if found is not None:
        return found
    num_experts, top_k = family_of(model, checked_version()).sizes(text_config(model.config))
    return bind(ReplayController(num_experts=num_experts, top_k=top_k), model)


def existing(model: nn.Module) -> Binding | None:
    return _BINDINGS.get(model)


def unbind(controller: ReplayController) -> None:
    for model, binding in list(_BINDINGS.items()):
        if binding.controller is controller:
            del _BINDINGS[model]
    rr_transformers.detach(controller)
