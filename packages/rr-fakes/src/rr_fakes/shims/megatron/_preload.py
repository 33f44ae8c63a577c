"""Imported once by the launcher's fork server, before it forks any rank: torch, and
megatron-core's modules the harness builds models from (under :func:`megatron_cpu`, as every
rank imports them) where megatron-core is installed. A rank then starts with them loaded.

Nothing here may fail the server: what does not import is left for the rank, which imports it
itself and reports the error where a test sees it."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

import torch  # noqa: F401

_MEGATRON_MODULES = (
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.models.gpt",
    "megatron.core.transformer.moe.router",
)


def _megatron() -> None:
    if importlib.util.find_spec("megatron") is None:
        return
    from rr_fakes.shims.megatron._shims import megatron_cpu

    with megatron_cpu():
        for name in _MEGATRON_MODULES:
            importlib.import_module(name)


with contextlib.suppress(Exception):
    _megatron()
