"""The replay flag on Megatron config *instances* (never a class default: other models of the
same process, e.g. a reference or critic model, must not pick it up).

On 0.16+ routers create their native ``RouterReplay`` only when the config they are built with
has ``moe_enable_routing_replay`` set, and that object is where rr's hook lives; so call
:func:`enable_replay` on the config before building the model. Before 0.16 there is no flag
and nothing needs to be set. Works for ``TransformerConfig`` and its subclasses
(``MLATransformerConfig``), and for configs rebuilt per instance by other libraries.
"""

from __future__ import annotations

from typing import Any

from rr_megatron_compat._guards import ReplayConfigError, check_replay_config
from rr_megatron_compat._versions import megatron_line

REPLAY_FLAG = "moe_enable_routing_replay"


def enable_replay(config: Any, *, capacity: str = "warn") -> Any:
    """Set the replay flag on ``config`` (0.16+) after checking it for settings replay cannot
    honour (see :func:`check_replay_config`); returns ``config``."""
    check_replay_config(config, capacity=capacity)
    if megatron_line().native_replay:
        if REPLAY_FLAG not in {f for klass in type(config).__mro__ for f in vars(klass)}:
            raise ReplayConfigError(
                f"{type(config).__name__} has no {REPLAY_FLAG} field although megatron-core "
                f"{megatron_line().version} should have one; is this a Megatron config?"
            )
        vars(config)[REPLAY_FLAG] = True  # the instance only, also on frozen rebuilt classes
    return config


def replay_config_fields() -> dict[str, bool]:
    """The ``TransformerConfig`` fields that turn replay on for the installed line, to pass where
    a config is built from keyword arguments (``{"moe_enable_routing_replay": True}`` on 0.16+,
    nothing before); :func:`enable_replay` sets the same on an existing instance."""
    return {REPLAY_FLAG: True} if megatron_line().native_replay else {}


def replay_enabled(config: Any) -> bool:
    """Whether routers built from ``config`` can be driven by rr (always True before 0.16)."""
    return not megatron_line().native_replay or bool(getattr(config, REPLAY_FLAG, False))
