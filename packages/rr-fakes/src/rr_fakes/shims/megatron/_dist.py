"""Process groups for the CPU harness: gloo plus Megatron's parallel state.

Megatron builds every parallel group with ``torch.distributed.new_group`` on the default
backend, so a gloo default group gives gloo groups for TP / PP / EP / DP, which is what lets
one machine without GPUs run real pipeline and expert-parallel steps.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rr_fakes.shims.megatron._flags import MegatronFlags
from rr_fakes.shims.megatron._shims import megatron_cpu


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def gloo_group(
    rank: int = 0,
    world_size: int | None = None,
    *,
    port: int | None = None,
    timeout_s: float = 60.0,
) -> Iterator[None]:
    """The default process group on gloo over 127.0.0.1 (size 1 unless ``world_size``);
    destroyed on exit (after a barrier when it exits cleanly). Reuses an existing default group
    (a launched rank already has one) when ``world_size`` is None or matches it."""
    if dist.is_initialized():
        if world_size is not None and dist.get_world_size() != world_size:
            raise RuntimeError(
                f"a process group of world size {dist.get_world_size()} already exists; "
                f"asked for {world_size}"
            )
        yield
        return
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port or free_port()}",
        rank=rank,
        world_size=1 if world_size is None else world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        yield
        if dist.get_world_size() > 1:
            # Rank 0 hosts the group's store: leaving before the peers finish their own calls
            # (a new_group, say) breaks their pipe to it ("DistNetworkError: Broken pipe").
            dist.barrier()
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True, kw_only=True)
class ParallelSizes:
    """Megatron's model-parallel sizes; the data-parallel size is what the world leaves."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1

    def check(self, world_size: int) -> None:
        model = self.tp * self.pp
        if world_size % model or (world_size // self.pp) % self.ep:
            raise ValueError(
                f"world size {world_size} does not fit tp={self.tp} x pp={self.pp} "
                f"(and ep={self.ep} within each pipeline stage)"
            )


@contextlib.contextmanager
def model_parallel(
    sizes: ParallelSizes = ParallelSizes(), *, seed: int = 1234
) -> Iterator[MegatronFlags]:
    """Inside :func:`megatron_cpu`: a gloo world (size 1 unless a launcher made one),
    ``parallel_state.initialize_model_parallel`` with ``sizes``, and torch's generator and
    Megatron's RNG streams seeded with ``seed``. Destroys the parallel state and restores
    torch's generator on exit. Yields the installed line's flags."""
    with megatron_cpu() as flags, gloo_group():
        sizes.check(dist.get_world_size())
        ps = importlib.import_module("megatron.core.parallel_state")
        random = importlib.import_module("megatron.core.tensor_parallel.random")
        ps.initialize_model_parallel(
            tensor_model_parallel_size=sizes.tp,
            pipeline_model_parallel_size=sizes.pp,
            virtual_pipeline_model_parallel_size=sizes.vpp,
            expert_model_parallel_size=sizes.ep,
        )
        rng_state = torch.get_rng_state()
        try:
            # As Megatron's training setup (_set_random_seed) does: CPU initialisation draws
            # from torch's default generator, dropout and experts from the tracker's streams.
            torch.manual_seed(seed)
            random.model_parallel_cuda_manual_seed(seed)
            yield flags
        finally:
            ps.destroy_model_parallel()
            torch.set_rng_state(rng_state)
