"""Replay configs that survive MindSpeed's per-instance TransformerConfig rebuild.

Under MindSpeed a config's class is generated per instance (module ``types`` on 3.11): pickling
fails, and ``dataclasses.replace`` builds through the generated class without MindSpeed's
rebuild, so the copy lacks MindSpeed's merged arguments and whatever was set after construction
(and MindSpeed's validation in ``__post_init__`` then raises). rr never adds a class-level
default (MindSpeed keeps a class default over the value passed in) and never wraps ``__init__``
(the signature MindSpeed reads must stay real). Where rr owns the copy it goes through plain
data: :func:`config_to_plain` / :func:`config_from_plain` (for other processes) and
:func:`replace_config` (in-process), which keep every instance attribute, the replay flag
included.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

import rr_megatron_compat as rmc
from rr_megatron_compat import ReplayConfigError
from rr_npu._routing import check_routing_not_replaced


def _importable(klass: type) -> bool:
    """Is ``klass`` what its module and qualified name resolve to? A class MindSpeed generates
    per instance is not (its module is ``types`` on Python 3.11, the caller's on 3.12+)."""
    obj: Any = sys.modules.get(klass.__module__)
    for part in klass.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is klass


def enable_replay(config: Any, *, capacity: str = "warn") -> Any:
    """``rr_megatron_compat.enable_replay`` after refusing MindSpeed replacements the router
    reaches; the flag goes on the instance only. Returns ``config``."""
    check_routing_not_replaced(config)
    return rmc.enable_replay(config, capacity=capacity)


def declared_class(config: Any) -> type:
    """The real (importable) config class behind a per-instance generated one."""
    for klass in type(config).__mro__:
        if _importable(klass):
            return klass
    raise ReplayConfigError(
        f"{type(config)!r} has no importable base class; pass a Megatron config instance"
    )


def config_to_plain(config: Any) -> dict[str, Any]:
    """Plain data for ``config``: its importable class, its ``__init__`` fields and every other
    instance attribute (MindSpeed's merged arguments, the replay flag). Picklable wherever the
    values are; send this across processes, not the config."""
    klass = declared_class(config)
    if not dataclasses.is_dataclass(klass) or not hasattr(config, "__dict__"):
        raise ReplayConfigError(
            f"config_to_plain takes a Megatron config (a dataclass instance); got "
            f"{type(config).__name__}"
        )
    init_names = {f.name for f in dataclasses.fields(klass) if f.init}
    values = dict(vars(config))
    return {
        "class": f"{klass.__module__}:{klass.__qualname__}",
        "fields": {k: v for k, v in values.items() if k in init_names},
        "extra": {k: v for k, v in values.items() if k not in init_names},
    }


def _resolve(path: object) -> type:
    if not isinstance(path, str) or ":" not in path:
        raise ReplayConfigError(f"config class must be 'module:QualName'; got {path!r}")
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise ReplayConfigError(f"config class {path} cannot be imported here: {error}") from error
    if not isinstance(obj, type) or not dataclasses.is_dataclass(obj):
        raise ReplayConfigError(f"{path} is not a config class (a dataclass)")
    return obj


_PLAIN_KEYS = ("class", "fields", "extra")


def config_from_plain(data: dict[str, Any], **changes: Any) -> Any:
    """Build a config from :func:`config_to_plain` data (with ``changes`` to init fields);
    instance attributes are put back afterwards, so nothing the original carried is lost.
    Under MindSpeed the construction goes through its rebuild like any other."""
    if not isinstance(data, dict) or set(data) != set(_PLAIN_KEYS):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ReplayConfigError(
            f"config_from_plain takes what config_to_plain returns (a dict with keys "
            f"{list(_PLAIN_KEYS)}); got {got}"
        )
    for key in ("fields", "extra"):
        if not isinstance(data[key], dict) or not all(isinstance(k, str) for k in data[key]):
            raise ReplayConfigError(
                f"config_from_plain: data[{key!r}] must be a dict of field names; got "
                f"{type(data[key]).__name__}"
            )
    klass = _resolve(data["class"])
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(klass) if f.init})
    if unknown:
        raise ReplayConfigError(
            f"{klass.__name__} has no init fields {unknown}; change only its __init__ fields"
        )
    config = klass(**{**data["fields"], **changes})
    for name, value in data["extra"].items():
        vars(config)[name] = value  # the instance only (frozen rebuilt classes too)
    return config


def replace_config(config: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that keeps instance attributes of a rebuilt config (the replay
    flag, MindSpeed's merged arguments)."""
    return config_from_plain(config_to_plain(config), **changes)
