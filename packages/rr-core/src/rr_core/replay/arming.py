"""Arming: a micro-batch's replay targets, checked once, kept until the step ends (B2).

Shapes: T rows the router sees, R armed source rows, L layer slots, K top-k.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from rr_core.checks import check_instance, describe
from rr_core.errors import ReplayError
from rr_core.replay.modes import check_hashable, check_routes, layer_numbers_of
from rr_core.replay.state import Armed, ControllerState
from rr_core.replay.targets import check_target_ids
from rr_core.routes.batch import RouteBatch


class Arming(ControllerState):
    """The controller's targets: arm, arm a route batch, release."""

    _slot_maps: dict[tuple[int, ...], tuple[int, ...]]
    _last_layers: tuple[object, tuple[int, ...]] = (object(), ())  # (as passed, as checked)

    def arm(
        self,
        microbatch: Hashable,
        routes_TLK: torch.Tensor,
        *,
        layer_numbers: Sequence[int],
        replay_mask_T: torch.Tensor | None = None,
        rows_T: torch.Tensor | None = None,
        validate: bool = True,
        ids_validated: bool = False,
    ) -> None:
        """Arm replay targets for one micro-batch, rows in the router's token order.

        ``layer_numbers`` names the global layer of each slot of ``routes_TLK``; every attached
        router's layer must be among them (extra slots, e.g. dense layers of an ``all_layers``
        axis or other pipeline stages, are ignored). ``replay_mask_T`` marks rows to replay;
        the others route natively. ``rows_T`` (int64 ``[T]``) arms ``routes_TLK`` as ``[R, L, K]``
        source rows, router row t replaying row ``rows_T[t]`` (rows outside the mask may point
        at any row), so a padded batch is armed without laying its routes out row by row; each
        router call then gathers its layer's ``[T, K]`` ids. ``validate=False`` skips the id
        checks for routes that were validated upstream; ids outside ``[0, E)`` then raise when
        a router replays them. ``ids_validated=True`` with it says the replayed rows' ids were
        checked where they were built (a :class:`RouteBatch`'s ``ids_validated``): the
        replaying call then takes the compiled path that checked ids allow.
        Inputs of the wrong type, dtype or shape raise :class:`ReplayError` either way.
        """
        self._check_attached("arm")
        check_hashable(microbatch)
        check_routes(microbatch, routes_TLK)
        if microbatch in self._armed:
            raise ReplayError(
                f"micro-batch {microbatch!r} is still armed from an earlier pass; call "
                "end_step() (or release()) between passes so stale targets are never replayed"
            )
        if self._last_layers[0] is layer_numbers:  # the same (immutable) tuple as last time
            key = self._last_layers[1]
        else:
            key = layer_numbers_of(layer_numbers, "layer_numbers")
            if type(layer_numbers) is tuple:
                self._last_layers = (layer_numbers, key)
        slot_of_router = self._slot_maps.get(key)
        if slot_of_router is None:
            slot_of_router = self._slot_maps[key] = self._slot_map(key)
        if routes_TLK.dim() != 3 or routes_TLK.shape[1:] != (len(key), self.top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes must be [T, {len(key)}, {self.top_k}] "
                f"(T, layer slots, top-k); got {list(routes_TLK.shape)}"
            )
        if rows_T is not None:
            _check_rows(microbatch, rows_T, routes_TLK)
        rows = routes_TLK.shape[0] if rows_T is None else rows_T.shape[0]
        _check_mask(microbatch, replay_mask_T, rows)
        for name, flag in (("validate", validate), ("ids_validated", ids_validated)):
            if not isinstance(flag, bool):
                raise ReplayError(f"{name} must be True or False; got {flag!r}")
        if validate:
            slot_layers = {slot: self._layers[i] for i, slot in enumerate(slot_of_router)}
            check_target_ids(
                routes_TLK,
                num_experts=self.num_experts,
                replay_mask_T=replay_mask_T,
                slot_layers=slot_layers,
                microbatch=microbatch,
                rows_T=rows_T,
            )
        consumed = [False] * len(self._routers)
        self._armed[microbatch] = Armed(
            routes_TLK,
            slot_of_router,
            replay_mask_T,
            consumed,
            rows_T=rows_T,
            validated=validate or ids_validated,
            rows=rows,
        )

    def arm_batch(
        self,
        microbatch: Hashable,
        batch: RouteBatch,
        *,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        """Arm a :class:`RouteBatch` whose sequences, concatenated, are the tokens the routers
        see (packed/THD order); rows without a route go to the native router. The ids are not
        checked again: a batch built with ``validate=False`` (``ids_validated`` False) replays
        them as they are, and adapters that size buffers by K ids a row then count its rows.
        ``provenance``: where the routes came from (a record header's ``provenance``, or
        ``EngineConfig.provenance()``), shown beside the agreement in the step report."""
        self._check_attached("arm_batch")
        if provenance is not None and (
            not isinstance(provenance, Mapping) or not all(isinstance(k, str) for k in provenance)
        ):
            raise ReplayError(
                f"micro-batch {microbatch!r}: provenance must map setting names (str) to values; "
                f"got {describe(provenance)}"
            )
        check_instance(
            batch,
            RouteBatch,
            ReplayError,
            f"micro-batch {microbatch!r}: arm_batch takes a RouteBatch",
            " (use arm() for a [T, L, K] tensor)",
        )
        meta = batch.meta
        if (meta.num_experts, meta.top_k) != (self.num_experts, self.top_k):
            raise ReplayError(
                f"micro-batch {microbatch!r}: routes were captured with E={meta.num_experts}, "
                f"K={meta.top_k}; this model has E={self.num_experts}, K={self.top_k}"
            )
        self.arm(
            microbatch,
            batch.values_NLK,
            layer_numbers=meta.layer_numbers,
            replay_mask_T=batch.valid_N,
            validate=False,  # checked when the batch was (ids_validated), or by the caller
            ids_validated=batch.ids_validated,  # on its valid rows: the rows that replay
        )
        if provenance is not None:
            self._provenance[microbatch] = dict(provenance)

    def release(self, microbatch: Hashable) -> None:
        """Drop one micro-batch's targets and records without checking them."""
        check_hashable(microbatch)
        self._armed.pop(microbatch, None)
        self._recorded.pop(microbatch, None)
        self._provenance.pop(microbatch, None)

    def _slot_map(self, layer_numbers: tuple[int, ...]) -> tuple[int, ...]:
        slot = {layer: i for i, layer in enumerate(layer_numbers)}
        if len(slot) != len(layer_numbers):
            raise ReplayError(f"layer_numbers repeat a layer: {list(layer_numbers)}")
        missing = [layer for layer in self._layers if layer not in slot]
        if missing:
            raise ReplayError(
                f"routes cover layers {list(layer_numbers)} but the model has routers on layers "
                f"{missing} that they do not cover; pass the routes' true global layer numbers "
                "(an all_layers axis starts at layer 1, a moe_layers axis lists MoE layers only)"
            )
        return tuple(slot[layer] for layer in self._layers)


def _check_rows(microbatch: Hashable, rows_T: object, routes_RLK: torch.Tensor) -> None:
    """``rows_T`` is an int64 ``[T]`` index into the ``R`` armed rows, on their device."""
    if (
        not isinstance(rows_T, torch.Tensor)
        or rows_T.dtype != torch.int64
        or rows_T.dim() != 1
        or rows_T.layout != torch.strided
        or rows_T.device != routes_RLK.device
    ):
        got = (
            f"{rows_T.dtype} {list(rows_T.shape)} on {rows_T.device}"
            if isinstance(rows_T, torch.Tensor)
            else type(rows_T).__name__
        )
        raise ReplayError(
            f"micro-batch {microbatch!r}: rows_T must be an int64 [T] tensor on the routes' "
            f"device ({routes_RLK.device}); got {got}"
        )
    if rows_T.numel():
        lo, hi = (int(v) for v in torch.aminmax(rows_T))  # one host sync per micro-batch
        if lo < 0 or hi >= routes_RLK.shape[0]:
            raise ReplayError(
                f"micro-batch {microbatch!r}: rows_T spans [{lo}, {hi}], outside the "
                f"{routes_RLK.shape[0]} armed rows [0, {routes_RLK.shape[0]})"
            )


def _check_mask(microbatch: Hashable, replay_mask_T: object, rows: int) -> None:
    if replay_mask_T is None:
        return
    if not isinstance(replay_mask_T, torch.Tensor):
        raise ReplayError(
            f"micro-batch {microbatch!r}: replay mask must be a bool torch.Tensor "
            f"[{rows}] or None; got {type(replay_mask_T).__name__}"
        )
    if (
        replay_mask_T.shape != (rows,)
        or replay_mask_T.dtype != torch.bool
        or replay_mask_T.layout != torch.strided
    ):
        raise ReplayError(
            f"micro-batch {microbatch!r}: replay mask must be bool [{rows}]; "
            f"got {replay_mask_T.dtype} {list(replay_mask_T.shape)}"
        )
