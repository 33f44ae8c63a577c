"""``router_replay.mode`` read from every form a verl config takes.

verl states the mode on a dataclass where its yaml names one (``EngineRouterReplayConfig`` in
the Megatron and VeOmni engine configs, ``RouterReplayConfig`` on the actor). Its FSDP engine
yaml has no ``router_replay`` entry, so a Hydra ``+...fsdp_config.router_replay.mode=R3``
override reaches the engine as the plain dict ``{'mode': 'R3'}`` (``omega_conf_to_dataclass``
converts only entries with a ``_target_``), and a config built by hand may hold an omegaconf
``DictConfig``. Each is read; a spelling verl itself would not take is refused by name, since
verl's own checks compare the exact strings and a mode rr and verl read apart is a silent
wrong answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rr_transformers.verl._errors import VerlFSDPReplayError

MODES = ("disabled", "R2", "R3")


def read_mode(router_replay: Any) -> str:
    """The mode ``router_replay`` states: ``"disabled"`` where it is absent (None, or a dict
    or config without ``mode``), else one of :data:`MODES`, exactly as verl spells them."""
    if router_replay is None:
        return "disabled"
    if isinstance(router_replay, Mapping):  # dict, omegaconf DictConfig
        mode = router_replay.get("mode", "disabled")
    elif hasattr(router_replay, "mode"):  # verl's dataclasses, any attribute-style config
        mode = router_replay.mode
    else:
        raise VerlFSDPReplayError(
            "router_replay must be a mapping or config with a 'mode' (e.g. {'mode': 'R3'}); "
            f"got {type(router_replay).__name__} {router_replay!r}"
        )
    return _checked(mode)


def _checked(mode: Any) -> str:
    if isinstance(mode, str) and mode in MODES:
        return mode
    if isinstance(mode, str):
        near = [m for m in MODES if m.casefold() == mode.strip().casefold()]
        if near:
            raise VerlFSDPReplayError(
                f"router_replay.mode={mode!r} is not verl's spelling; write {near[0]!r} "
                "(verl compares the exact string, so rr does not read it otherwise)"
            )
    raise VerlFSDPReplayError(f"router_replay.mode must be one of {list(MODES)}; got {mode!r}")
