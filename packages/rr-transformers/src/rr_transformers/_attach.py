"""The transformers adapter (:mod:`rr_core.adapters`): ``attach`` finds each router of a real
``PreTrainedModel`` by its decoder layer and hands them to a :class:`rr_core.ReplayController`.

Routers are addressed by decoder layer (layer i of ``layers`` is global layer i + 1, the
all-layers axis vLLM and SGLang return). Only the text decoder is walked: vision and audio
towers, and the multi-token-prediction weights transformers does not build, are never on the
axis. Dense layers and shared experts have no route.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from rr_core import ReplayController, WalkError
from rr_core import adapters as core
from rr_transformers._errors import UnknownFamilyError
from rr_transformers._families import Family, family_of, text_config
from rr_transformers._install import hooked, install_hooks
from rr_transformers._packed import forget_packed, guard_decoder
from rr_transformers._probe import prove_hooks
from rr_transformers._versions import checked_version

ScoreFunction = Literal["softmax", "sigmoid", "topk_softmax"]


@dataclass(frozen=True)
class Attachment(core.Attachment):
    """What :func:`attach` found: the routed layers (global, 1-based, one per routed decoder
    layer), E and K, and the family and the decoder's size."""

    family: Family
    num_layers: int

    @property
    def model_type(self) -> str:
        return self.family.model_type


def decoder_layers(model: nn.Module) -> Sequence[nn.Module]:
    """The text decoder's layers: ``get_decoder().layers`` (a vision-language model's decoder is
    its language model), checked against the text config's ``num_hidden_layers``."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    layers = getattr(decoder, "layers", None)
    expected = getattr(text_config(getattr(model, "config", None)), "num_hidden_layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise WalkError(
            f"{type(model).__name__}.get_decoder() has no `layers` ModuleList (got "
            f"{type(decoder).__name__}); attach a transformers PreTrainedModel"
        )
    if expected is not None and len(layers) != expected:
        raise WalkError(
            f"{type(model).__name__}'s decoder has {len(layers)} layers; its config says "
            f"num_hidden_layers={expected}"
        )
    return list(layers)


def _routers(layers: Sequence[nn.Module], family: Family) -> list[tuple[int, nn.Module]]:
    router_class = family.router_class()
    found = []
    for index, layer in enumerate(layers):
        routers = [m for m in layer.modules() if type(m) is router_class]
        blocks = [
            name
            for name, m in layer.named_modules()
            if isinstance(getattr(m, "experts", None), nn.Module)
        ]
        if len(routers) > 1:
            raise WalkError(f"decoder layer {index} holds {len(routers)} {family.router}s")
        if blocks and not routers:
            raise UnknownFamilyError(
                f"decoder layer {index} has experts ({blocks[0]!r}) but no {family.router}: "
                f"its router is {_router_like(layer)}, not transformers' {family.model_type} "
                "router (remote code or a replaced block); rr does not know its semantics"
            )
        if routers:
            found.append((index + 1, routers[0]))
    return found


def _router_like(layer: nn.Module) -> str:
    names = [type(m).__name__ for n, m in layer.named_modules() if n.endswith(("gate", "router"))]
    return names[0] if names else "unknown"


class TransformersAdapter(core.Adapter):
    """rr's router hooks in every known transformers MoE family."""

    name = "transformers"
    module = "rr_transformers"

    def check_dependencies(self, *, force: bool) -> None:
        checked_version()

    def _install(self, *, force: bool) -> tuple[str, ...]:
        return install_hooks(self.patches)

    def attach(self, controller: Any, model: Any, **options: Any) -> Attachment:
        """Give ``controller`` the routers of ``model`` (call :func:`install` first).

        Checks the model's E and top-k against the controller's, and its score function against
        ``score_function`` when given (routes recorded from a sigmoid router mean nothing to a
        softmax one). A model whose family rr does not know raises :class:`UnknownFamilyError`.
        The order ``attach(model, controller)`` of earlier releases still works, with a
        DeprecationWarning."""
        if isinstance(controller, nn.Module) and isinstance(model, ReplayController):
            warnings.warn(
                "rr_transformers.attach(model, controller) is deprecated: every rr adapter "
                "takes attach(controller, model)",
                DeprecationWarning,
                stacklevel=2,
            )
            controller, model = model, controller
        installing = not self.install_requested  # the deprecated install-at-attach path
        try:
            found = super().attach(controller, model, **options)
        except BaseException:
            if installing and self.install_requested:
                self.uninstall()  # a refused attach leaves nothing installed, as it used to
            raise
        assert isinstance(found, Attachment)
        return found

    def _attach_before_install(self) -> None:
        """Earlier releases installed the hooks here; kept for one release."""
        warnings.warn(
            "rr_transformers.attach() before rr_transformers.install() is deprecated: call "
            "rr_transformers.install() first, as every rr adapter requires (this release still "
            "installs the hooks here; the next raises rr_core.adapters.NotInstalledError)",
            DeprecationWarning,
            stacklevel=5,  # the caller of attach()
        )
        self.install()

    def _attach(
        self,
        controller: ReplayController,
        model: Any,
        *,
        score_function: ScoreFunction | None = None,
    ) -> Attachment:
        version = checked_version()
        family = family_of(model, version)
        config = text_config(model.config)
        num_experts, top_k = family.sizes(config)
        if (num_experts, top_k) != (controller.num_experts, controller.top_k):
            raise WalkError(
                f"{type(model).__name__} routes top-{top_k} of E={num_experts} experts; the "
                f"controller expects top-{controller.top_k} of E={controller.num_experts}"
            )
        if score_function is not None and score_function != family.score:
            raise WalkError(
                f"{family.model_type} routers score with {family.score!r}; the routes were "
                f"recorded with {score_function!r}"
            )
        if not hooked(family):  # install() was called (the base checks): a re-patch since
            raise WalkError(
                f"the {family.model_type} router hook is no longer in place (another patch "
                "replaced it after rr_transformers.install()); call rr_transformers.install() "
                "again"
            )
        layers = decoder_layers(model)
        pairs = _routers(layers, family)
        prove_hooks(controller, model, pairs)  # the hooks take on this model, or it raises
        routed = controller.attach(model, walk=lambda _model: pairs)
        guard_decoder(model, model.get_decoder(), controller)
        return Attachment(
            adapter=self.name,
            layer_numbers=routed,
            num_experts=num_experts,
            top_k=top_k,
            family=family,
            num_layers=len(layers),
        )

    def _detach(self, controller: ReplayController) -> None:
        forget_packed(controller)
        controller.detach()


ADAPTER = TransformersAdapter()

install, uninstall, is_installed, attach, detach = ADAPTER.module_functions()


def installed() -> bool:
    """Deprecated (one release): the name of earlier releases of :func:`is_installed`."""
    warnings.warn(
        "rr_transformers.installed() is deprecated: call rr_transformers.is_installed(), the "
        "name every rr adapter uses",
        DeprecationWarning,
        stacklevel=2,
    )
    return ADAPTER.is_installed()
