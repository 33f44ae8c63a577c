"""The rollout's compact routes expanded where verl's trainer receives them: in the actor (and
reference) worker, as its training worker is handed the batch, so they cross Ray from verl's
trainer to its workers as rr's payload rather than verl's int16 rows (``L x K x 2`` bytes a
token).

:data:`ARRIVAL` is a verl side of its own (``rollout-arrival``): the switch installs it where a
process imports verl's engine workers, which verl's task runner and its worker processes do.
Where it is installed in the trainer's process, :mod:`rr_vllm.verl.rollout` leaves the routes
compact in the batch it hands the workers (checked there first)."""

from __future__ import annotations

import importlib
from typing import Any

from rr_core.adapters import Installer
from rr_core.verl_release import check_verl_release
from rr_vllm.verl.expand import FIELD, expand_samples, items_of, trained_samples

ENGINE_WORKERS = "verl.workers.engine_workers"
#: What verl's training worker is handed across Ray (each runs the engine on the batch).
ENTRIES = ("infer_batch", "train_mini_batch", "train_batch")


def expand_on_arrival(data: Any) -> None:
    """Replace the compact routes of a no-padding verl batch by verl's jagged
    ``routed_experts`` (in place; a batch without them is left as it is)."""
    if FIELD not in data.keys():  # noqa: SIM118 (a TensorDict refuses `in` on itself)
        return
    parts = items_of(data.pop(FIELD), data.batch_size[0])
    routes = expand_samples(parts, data["input_ids"].offsets(), trained_samples(data))
    if routes is not None:
        data["routed_experts"] = routes


def _on_arrival(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    expand_on_arrival(args[0] if args else kwargs["data"])
    return wrapped(*args, **kwargs)


class VerlSide(Installer):
    """A verl side of rr's rollout routes (the rollout, the arrival): refused on a verl release
    rr does not support (``what`` names the side), and hooked anew by ``_hook`` unless every
    patch of an earlier install is still in place."""

    what = "rr's verl side"

    def check_dependencies(self, *, force: bool) -> None:
        check_verl_release(self.what, force=force)

    def _install(self, *, force: bool) -> tuple[str, ...]:
        if not self.patches.in_place():
            self.patches.restore()
            self._hook()
        return self._hooked()

    def _hook(self) -> None:
        raise NotImplementedError

    def _hooked(self) -> tuple[str, ...]:
        """What the install hooked, as ``install()`` reports it."""
        return tuple(f"{getattr(o, '__name__', o)}.{a}" for o, a in self.patches)


class VerlArrivalAdapter(VerlSide):
    """verl's training worker expanding rr's compact routes as it receives a batch."""

    name = "verl-rollout-arrival"
    module = "rr_vllm.verl.arrival"
    verl_modules = (ENGINE_WORKERS,)
    what = "rr's verl routes on arrival"

    def _hook(self) -> None:
        worker = importlib.import_module(ENGINE_WORKERS).TrainingWorker
        for entry in ENTRIES:
            self.patches.wrap(worker, entry, _on_arrival)

    def _hooked(self) -> tuple[str, ...]:
        return tuple(f"TrainingWorker.{entry}" for entry in ENTRIES)


ARRIVAL = VerlArrivalAdapter()


def expands_in_workers() -> bool:
    """Whether this process's trainer leaves the routes compact for its workers: the arrival
    side is installed here and still acts (another library's wrapper over it, as a profiler's,
    leaves it acting), as the switch installs it in every process verl starts."""
    return ARRIVAL.install_requested and bool(ARRIVAL.live_patches())
