"""The attached routers: which routers a controller owns, their layer numbers and their modes.

Routers are addressed by their walk index ``i`` (ascending layer number); a router call finds
its index, layer and mode in one lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import nn

from rr_core.errors import ReplayError
from rr_core.replay.checks import layer_numbers_of
from rr_core.replay.modes import ReplayMode, as_mode
from rr_core.replay.owners import OWNERS, RouteOwner

#: What a router call needs to know of its router: (walk index, layer number, mode).
Entry = tuple[int, int, ReplayMode]


class AttachedRouters:
    """The routers of the attached model, keyed by walk index, and the mode of each."""

    def __init__(self) -> None:
        self._routers: list[nn.Module] = []
        self._layers: tuple[int, ...] = ()
        self._position: dict[int, int] = {}  # layer number -> walk index
        self._modes: list[ReplayMode] = []
        self._entries: dict[int, Entry] = {}  # id(router) -> its entry, refilled on a mode change
        self._attached = False
        #: ``entry(id(router))``: ``(walk index, layer, mode)`` of an attached router, None for
        #: any other. The dict's own lookup: a router call pays no Python frame for it.
        self.entry: Callable[[int], Entry | None] = self._entries.get

    def attach(self, walked: Sequence[tuple[int, nn.Module]], owner: RouteOwner) -> None:
        """Own the walked ``(layer, router)`` pairs (ascending layers), all in mode OFF."""
        for layer, router in walked:
            current = OWNERS.get(router)
            if current is not None and current is not owner:
                raise ReplayError(
                    f"the router of layer {layer} is already attached to another controller; "
                    "detach that one first (one controller per model)"
                )
        self.detach(owner)
        self._layers = tuple(layer for layer, _ in walked)
        self._routers = [router for _, router in walked]
        self._position = {layer: i for i, layer in enumerate(self._layers)}
        self._modes = [ReplayMode.OFF] * len(self._routers)
        self._attached = True  # also with zero routers: a stage of dense layers only (A6)
        self._rebuild_entries()
        for router in self._routers:
            OWNERS[router] = owner

    def detach(self, owner: RouteOwner) -> None:
        """Release the routers ``owner`` holds: they route natively again."""
        for router in self._routers:
            if OWNERS.get(router) is owner:
                del OWNERS[router]
        self._routers, self._layers, self._modes = [], (), []
        self._position = {}
        self._entries.clear()
        self._attached = False

    @property
    def layers(self) -> tuple[int, ...]:
        """The attached routers' layer numbers, in walk order (ascending)."""
        return self._layers

    def modules(self) -> list[nn.Module]:
        """The attached routers in walk order (a copy)."""
        return list(self._routers)

    def check_attached(self, method: str) -> None:
        if not self._attached:
            raise ReplayError(
                f"no model attached; call attach(model) before {method}() (a pipeline stage "
                "without MoE layers attaches too, and then has zero routers)"
            )

    def set_mode(self, mode: ReplayMode | str, layers: Sequence[int] | None) -> None:
        checked = as_mode(mode)
        self.check_attached("set_mode")
        chosen = range(len(self._routers)) if layers is None else self._indices_of(layers)
        for i in chosen:
            self._modes[i] = checked
        self._rebuild_entries()

    def mode_of(self, layer: int) -> ReplayMode:
        # adapters ask once per router call: a plain int of an attached layer is one lookup
        # (type(...) is int: a bool or a numpy int goes the checked way, which says why)
        index = self._position.get(layer) if type(layer) is int else None
        if index is None:
            index = self._indices_of([layer])[0]
        return self._modes[index]

    def walk_index(self) -> Mapping[int, int]:
        """``id(router) -> walk index`` of the attached routers, read-only."""
        return {key: entry[0] for key, entry in self._entries.items()}

    def _indices_of(self, layers: Sequence[int]) -> list[int]:
        layers = layer_numbers_of(layers, "layers")
        missing = [layer for layer in layers if layer not in self._position]
        if missing:
            raise ReplayError(f"layers {missing} have no attached router; have {self._layers}")
        return [self._position[layer] for layer in layers]

    def _rebuild_entries(self) -> None:
        self._entries.clear()  # in place: ``entry`` is this dict's lookup
        entries = zip(range(len(self._routers)), self._layers, self._modes, strict=True)
        self._entries.update(zip(map(id, self._routers), entries, strict=True))
