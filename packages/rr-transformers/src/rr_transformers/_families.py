"""The MoE families rr knows, as objects built from :data:`rr_transformers._supported.FAMILIES`,
and where each one's top-k step lives in the installed transformers."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rr_transformers._errors import UnknownFamilyError
from rr_transformers._supported import (
    FAMILIES,
    FAMILY_ALIASES,
    REFUSED_FAMILIES,
    ROUTE_IN_BLOCK_METHOD,
)
from rr_transformers._versions import routes_in_block


@dataclass(frozen=True)
class Family:
    """One MoE family: its router class, its config's E and K attributes, its semantics."""

    model_type: str
    module: str
    router: str
    experts_attr: str
    top_k_attr: str
    score: str
    normalise: bool | str
    expert_bias: bool = False
    group_limited: bool = False
    router_bias: bool = False
    scaling: str | None = None
    block: str | None = None
    since: str = "5.0"

    def available(self, version: Version) -> bool:
        return version in SpecifierSet(f">={self.since}")

    def modeling(self) -> Any:
        """``transformers.models.<module>.modeling_<module>`` (imported on first use)."""
        name = f"transformers.models.{self.module}.modeling_{self.module}"
        return importlib.import_module(name)

    def router_class(self) -> type:
        cls: type = getattr(self.modeling(), self.router)
        return cls

    def hook_names(self, version: Version) -> tuple[str, str, bool]:
        """(class name, attribute, on_block) of the function whose top-k call selects the
        experts in ``version`` (transformers is not imported)."""
        if self.block is not None and routes_in_block(version):
            return self.block, ROUTE_IN_BLOCK_METHOD, True
        return self.router, "forward", False

    def hook_site(self, version: Version) -> tuple[type, str, bool]:
        """(class, attribute, on_block): :meth:`hook_names` resolved in the modeling module."""
        owner, attribute, on_block = self.hook_names(version)
        return getattr(self.modeling(), owner), attribute, on_block

    def sizes(self, config: Any) -> tuple[int, int]:
        """(E, K) as the model's text config declares them."""
        return int(getattr(config, self.experts_attr)), int(getattr(config, self.top_k_attr))

    def normalises(self, config: Any) -> bool:
        if isinstance(self.normalise, bool):
            return self.normalise
        return bool(getattr(config, self.normalise))


def _family(model_type: str, data: dict[str, object]) -> Family:
    keys = {
        "module": "module", "router": "router", "experts": "experts_attr",
        "top_k": "top_k_attr", "score": "score", "normalise": "normalise",
        "expert_bias": "expert_bias", "group_limited": "group_limited",
        "router_bias": "router_bias", "scaling": "scaling", "block": "block", "since": "since",
    }  # fmt: skip
    return Family(model_type=model_type, **{keys[k]: v for k, v in data.items()})  # type: ignore[arg-type]


KNOWN_FAMILIES: dict[str, Family] = {name: _family(name, d) for name, d in FAMILIES.items()}


def text_config(config: Any) -> Any:
    """The decoder's config (a vision-language model keeps it in ``text_config``)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def family_of(model: Any, version: Version) -> Family:
    """The family of a model, from its text config's ``model_type`` (or the family whose code
    that model type runs, :data:`FAMILY_ALIASES`); refused by name when rr does not know its
    router semantics or knows they cannot be replayed (never replayed natively in silence)."""
    config = getattr(model, "config", None)
    model_type = getattr(text_config(config), "model_type", None)
    name = FAMILY_ALIASES.get(model_type, model_type) if isinstance(model_type, str) else None
    family = KNOWN_FAMILIES.get(name) if name is not None else None
    if isinstance(model_type, str) and model_type in REFUSED_FAMILIES:
        raise UnknownFamilyError(
            f"{type(model).__name__} (model_type {model_type!r}) is refused: "
            f"{REFUSED_FAMILIES[model_type]}; rr refuses rather than leave its routers routing "
            "natively under replay (see `rr explain B3`)"
        )
    if family is None:
        known = ", ".join(sorted(KNOWN_FAMILIES))
        raise UnknownFamilyError(
            f"{type(model).__name__} (model_type {model_type!r}) is not an MoE family whose "
            f"router semantics rr knows; known: {known}. rr refuses rather than leave its "
            "routers routing natively under replay (see `rr explain B3`)"
        )
    if not family.available(version):
        raise UnknownFamilyError(
            f"model_type {model_type!r} needs transformers>={family.since}; found {version}"
        )
    return family
