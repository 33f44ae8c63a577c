"""verl's rollout side: rr's codec payload in place of verl's int16 ``routed_experts``, and its
expansion into the tensors verl's trainers read.

``rr_megatron_compat.verl.install()`` (the one switch of every verl side; ``ADAPTER.install()``
this side alone) switches verl's agent loop and trainer padding to it (see
:mod:`rr_vllm.verl.rollout`), and verl's training worker to expand the routes it receives
(:data:`ARRIVAL`, :mod:`rr_vllm.verl.arrival`); :mod:`rr_vllm.verl.routes` holds the
conversions themselves (also exported by :mod:`rr_vllm`). verl itself is imported by
``install`` only."""

from rr_vllm.verl.arrival import ARRIVAL
from rr_vllm.verl.expand import FIELD, expand_samples
from rr_vllm.verl.rollout import (
    ADAPTER,
    attach,
    compact_sample,
    detach,
    install,
    is_installed,
    uninstall,
)

__all__ = [
    "ADAPTER",
    "ARRIVAL",
    "FIELD",
    "attach",
    "compact_sample",
    "detach",
    "expand_samples",
    "install",
    "is_installed",
    "uninstall",
]
