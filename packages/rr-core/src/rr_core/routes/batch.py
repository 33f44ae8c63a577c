"""Route batches: recorded top-k expert ids of many sequences, jagged, in the narrowest exact dtype.

Shape legend: N total token rows, B sequences, S padded length, T rows of one sequence, L slots on
the layer axis, K top-k. Row t of a sequence holds the ids chosen when token t was the input; a row
with no recorded route is marked invalid in ``valid_N`` rather than filled with a sentinel id.

What a batch describes is its :class:`~rr_core.routes.meta.RouteMeta`; the id dtypes are chosen in
:mod:`rr_core.routes.id_dtypes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, get_args

import torch

from rr_core.checks import as_index, check_choice
from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.axis import LayerAxis, check_layer_axis
from rr_core.routes.id_dtypes import holds_ids, narrow_ids, narrowest_dtype
from rr_core.routes.jagged import cat_rows, jagged_parts, offsets_tensor, same_offsets
from rr_core.routes.meta import RouteMeta
from rr_core.routes.validate import ArrayLike, as_bool, as_int_tensor, check_padded, check_structure
from rr_core.routes.validate_ids import check_ids

# RouteMeta, cat_rows and the id dtypes live in routes.meta, routes.jagged and routes.id_dtypes;
# they stay importable from here, where they were first defined.
__all__ = [
    "PADDING_SIDES",
    "PaddingSide",
    "RouteBatch",
    "RouteMeta",
    "SequenceIndexError",
    "cat_rows",
    "holds_ids",
    "narrow_ids",
    "narrowest_dtype",
]

PaddingSide = Literal["left", "right"]
PADDING_SIDES: tuple[str, ...] = get_args(PaddingSide)


class SequenceIndexError(RouteValidationError, IndexError):
    """:meth:`RouteBatch.sequence` of an index outside the batch: an RRError that is also the
    IndexError of Python's sequence protocol."""


class RouteBatch:
    """Routes of B sequences, jagged: sequence b is ``values_NLK[offsets_B1[b]:offsets_B1[b+1]]``.

    Constructors validate (see :meth:`validate`) unless ``validate=False``; the cheap structural
    checks (shapes, dtypes, offsets) always run, because every method relies on them.
    ``ids_validated`` says whether the ids were checked (by the constructor or :meth:`validate`,
    carried by the batches derived from this one): a replay controller armed with such a batch
    needs no check of its own, and no adapter re-counts its rows.
    """

    __slots__ = ("ids_validated", "meta", "offsets_B1", "valid_N", "values_NLK")

    def __init__(
        self,
        values_NLK: ArrayLike,
        offsets_B1: torch.Tensor | Sequence[int],
        valid_N: ArrayLike | None,
        meta: RouteMeta,
        *,
        validate: bool = True,
        allow_all_zero: bool = False,
    ) -> None:
        if not isinstance(meta, RouteMeta):
            raise RouteValidationError(f"meta must be a RouteMeta; got {type(meta).__name__}")
        values = narrow_ids(values_NLK, meta.num_experts)
        dev = values.device
        if isinstance(offsets_B1, torch.Tensor):
            offsets = as_int_tensor(offsets_B1, "offsets_B1").to(dev, torch.int64)
        else:
            offsets = offsets_tensor(offsets_B1, dev)
        n = values.shape[0] if values.dim() else 0
        valid = torch.ones(n, dtype=torch.bool) if valid_N is None else as_bool(valid_N, "valid_N")
        self.values_NLK, self.offsets_B1, self.valid_N = values, offsets, valid.to(dev)
        self.meta = meta
        check_structure(values, offsets, self.valid_N, meta)
        self.ids_validated = False
        if validate:
            check_ids(values, offsets, self.valid_N, meta, allow_all_zero=allow_all_zero)
            self.ids_validated = True

    @classmethod
    def _trusted(
        cls,
        values: torch.Tensor,
        offsets: torch.Tensor,
        valid: torch.Tensor,
        meta: RouteMeta,
        ids_validated: bool,
    ) -> RouteBatch:
        """Build from parts derived from structurally checked batches, skipping every check;
        ``ids_validated`` as theirs."""
        out = object.__new__(cls)
        out.values_NLK, out.offsets_B1, out.valid_N, out.meta = values, offsets, valid, meta
        out.ids_validated = ids_validated
        return out

    @classmethod
    def from_sequences(
        cls,
        seqs: Sequence[ArrayLike],
        meta: RouteMeta,
        *,
        valid: Sequence[ArrayLike] | None = None,
        validate: bool = True,
        allow_all_zero: bool = False,
    ) -> RouteBatch:
        """From per-sequence ``[T_i, L, K]`` ids (any int dtype) and optional ``[T_i]`` masks."""
        if not isinstance(meta, RouteMeta):
            raise RouteValidationError(f"meta must be a RouteMeta; got {type(meta).__name__}")
        if not isinstance(seqs, Sequence) or isinstance(seqs, (str, bytes)):
            raise RouteValidationError(
                f"seqs must be a sequence of [T, L, K] arrays; got {type(seqs).__name__}"
            )
        L, K = len(meta.layer_numbers), meta.top_k
        parts: list[torch.Tensor] = []
        for i, s in enumerate(seqs):
            try:
                t = narrow_ids(s, meta.num_experts)
            except RouteValidationError as e:
                raise RouteValidationError(f"sequence {i}: {e}") from e
            if t.dim() != 3 or tuple(t.shape[1:]) != (L, K):
                raise RouteValidationError(
                    f"sequence {i} has shape {tuple(t.shape)}; expected [T, {L}, {K}] (L = "
                    f"len(meta.layer_numbers) on the {meta.layer_axis} axis, K = meta.top_k)"
                )
            parts.append(t)
        dtype = narrowest_dtype(meta.num_experts)
        values = cat_rows(parts) if parts else torch.zeros(0, L, K, dtype=dtype)
        lengths = [p.shape[0] for p in parts]
        offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
        valid_N = None
        if valid is not None:
            if len(valid) != len(parts):
                raise RouteValidationError(
                    f"valid has {len(valid)} masks for {len(parts)} sequences"
                )
            masks = [as_bool(m, f"valid[{i}]") for i, m in enumerate(valid)]
            for i, (m, n) in enumerate(zip(masks, lengths, strict=True)):
                if tuple(m.shape) != (n,):
                    raise RouteValidationError(
                        f"valid[{i}] has shape {tuple(m.shape)}; sequence {i} has {n} rows"
                    )
            valid_N = cat_rows(masks).to(values.device) if masks else None
        return cls(values, offsets, valid_N, meta, validate=validate, allow_all_zero=allow_all_zero)

    @classmethod
    def from_padded(
        cls,
        padded_BSLK: ArrayLike,
        token_mask_BS: ArrayLike,
        meta: RouteMeta,
        *,
        valid_BS: ArrayLike | None = None,
        validate: bool = True,
        allow_all_zero: bool = False,
    ) -> RouteBatch:
        """From padded ``[B, S, L, K]`` routes; ``token_mask_BS`` marks real tokens wherever the
        padding sits (left, right, or both: a left-padded prompt and a right-padded response).
        ``valid_BS`` defaults to the token mask."""
        values = as_int_tensor(padded_BSLK, "padded routes")
        mask = as_bool(token_mask_BS, "token_mask_BS").to(values.device)
        valid = mask if valid_BS is None else as_bool(valid_BS, "valid_BS").to(values.device)
        check_padded(values, mask, valid)
        offsets = torch.cat([mask.new_zeros(1, dtype=torch.int64), mask.sum(1).cumsum(0)])
        return cls(
            values[mask],
            offsets,
            valid[mask],
            meta,
            validate=validate,
            allow_all_zero=allow_all_zero,
        )

    @classmethod
    def from_nested(
        cls,
        values_nt: torch.Tensor,
        meta: RouteMeta,
        *,
        valid_nt: torch.Tensor | None = None,
        validate: bool = True,
        allow_all_zero: bool = False,
    ) -> RouteBatch:
        """From a nested ``[B, j, L, K]`` tensor and optional nested ``[B, j]`` mask. Contiguous
        jagged tensors are read as a whole; any other nested layout is unbound per sequence."""
        if not values_nt.is_nested or (valid_nt is not None and not valid_nt.is_nested):
            raise RouteValidationError("from_nested expects nested tensors; use from_padded")
        parts = jagged_parts(values_nt)
        vparts = None if valid_nt is None else jagged_parts(valid_nt)
        if parts is None or (valid_nt is not None and not same_offsets(parts, vparts)):
            masks = None if valid_nt is None else list(valid_nt.unbind())
            return cls.from_sequences(
                list(values_nt.unbind()),
                meta,
                valid=masks,
                validate=validate,
                allow_all_zero=allow_all_zero,
            )
        valid = None if vparts is None else vparts[0]
        return cls(*parts, valid, meta, validate=validate, allow_all_zero=allow_all_zero)

    @property
    def num_sequences(self) -> int:
        return self.offsets_B1.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.values_NLK.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Rows per sequence, ``[B]`` int64."""
        return self.offsets_B1.diff()

    def __repr__(self) -> str:
        _, L, K = self.values_NLK.shape
        return (
            f"RouteBatch(B={self.num_sequences}, N={self.num_tokens}, L={L}, K={K}, "
            f"E={self.meta.num_experts}, axis={self.meta.layer_axis}, "
            f"dtype={self.values_NLK.dtype}, device={self.values_NLK.device})"
        )

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(values_TLK, valid_T)`` of sequence ``i`` (negative ``i`` from the end)."""
        B, i = self.num_sequences, as_index(i, "sequence index", RouteValidationError)
        if not -B <= i < B:
            raise SequenceIndexError(f"sequence {i} out of range for a batch of {B}")
        a, b = self.offsets_B1[i % B : i % B + 2].tolist()
        return self.values_NLK[a:b], self.valid_N[a:b]

    def to(self, device: torch.device | str) -> RouteBatch:
        values, offsets, valid = (
            t.to(device) for t in (self.values_NLK, self.offsets_B1, self.valid_N)
        )
        return RouteBatch._trusted(values, offsets, valid, self.meta, self.ids_validated)

    def equal(self, other: RouteBatch) -> bool:
        """Exact equality of values (dtype included), offsets, validity and meta."""
        mine = (self.values_NLK, self.offsets_B1, self.valid_N)
        theirs = (other.values_NLK, other.offsets_B1, other.valid_N)
        return self.meta == other.meta and all(
            a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and torch.equal(a, b)
            for a, b in zip(mine, theirs, strict=True)
        )

    def validate(self, *, allow_all_zero: bool = False) -> None:
        """Raise :class:`RouteValidationError` naming sequence, row, layer and ids on the first
        problem: shape or dtype, ids outside ``[0, E)`` or repeated, non-zero dense slots, or a MoE
        slot that is zero on every valid row of a sequence (E1, unless ``allow_all_zero``)."""
        check_structure(self.values_NLK, self.offsets_B1, self.valid_N, self.meta)
        check_ids(
            self.values_NLK, self.offsets_B1, self.valid_N, self.meta, allow_all_zero=allow_all_zero
        )
        self.ids_validated = True

    def _padded_length(self, padding_side: str, length: int | None) -> int:
        check_choice(padding_side, "padding_side", PADDING_SIDES, RouteValidationError)
        longest = int(self.lengths.max()) if self.num_sequences else 0
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
            raise RouteValidationError(f"length must be an int or None; got {length!r}")
        if length is not None and length < longest:
            raise RouteValidationError(
                f"length={length} is shorter than the longest sequence ({longest} rows)"
            )
        return longest if length is None else length

    def padded_token_mask(
        self, padding_side: PaddingSide = "right", length: int | None = None
    ) -> torch.Tensor:
        """``[B, S]`` bool marking real tokens in :meth:`to_padded`'s layout, whose ``valid_BS``
        leaves out real rows without a route; pass both to :meth:`from_padded` to come back."""
        S = self._padded_length(padding_side, length)
        pos_1S = torch.arange(S, device=self.offsets_B1.device)[None, :]
        lengths_B1 = self.lengths[:, None]
        return pos_1S < lengths_B1 if padding_side == "right" else pos_1S >= S - lengths_B1

    def to_padded(
        self, padding_side: PaddingSide = "right", length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(padded_BSLK, valid_BS)``, ``S = length`` or the longest sequence; padding rows are
        zero and invalid."""
        S = self._padded_length(padding_side, length)
        B, (N, L, K) = self.num_sequences, self.values_NLK.shape
        dev = self.offsets_B1.device
        seq_N = torch.repeat_interleave(torch.arange(B, device=dev), self.lengths, output_size=N)
        pos_N = torch.arange(N, device=dev) - self.offsets_B1[seq_N]
        if padding_side == "left":
            pos_N += (S - self.lengths)[seq_N]
        padded = self.values_NLK.new_zeros((B, S, L, K))
        valid = torch.zeros((B, S), dtype=torch.bool, device=dev)
        padded[seq_N, pos_N] = self.values_NLK
        valid[seq_N, pos_N] = self.valid_N
        return padded, valid

    def to_nested(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Jagged nested tensors ``([B, j, L, K] values, [B, j] validity)`` sharing storage."""
        nt = torch.nested.nested_tensor_from_jagged
        return nt(self.values_NLK, self.offsets_B1), nt(self.valid_N, self.offsets_B1)

    def to_layer_axis(self, axis: LayerAxis, *, num_layers: int | None = None) -> RouteBatch:
        """The same routes on another layer axis, from the meta's layer numbers alone.

        ``moe_layers`` keeps the MoE slots; ``all_layers`` lays them out on layers
        ``1..num_layers`` (required when leaving ``moe_layers``) with zeros in the dense slots.
        """
        m, dev = self.meta, self.values_NLK.device
        axis = check_layer_axis(axis, "axis")
        if axis == "moe_layers":
            if num_layers is not None:
                raise LayoutError("num_layers applies only to the all_layers axis")
            if m.layer_axis == "moe_layers":
                return self
            meta = dataclasses.replace(
                m,
                layer_axis="moe_layers",
                layer_numbers=m.routed_layer_numbers,
                moe_layer_numbers=None,
            )
            values = self.values_NLK.index_select(1, torch.tensor(m.moe_slots, device=dev))
            return RouteBatch._trusted(
                values, self.offsets_B1, self.valid_N, meta, self.ids_validated
            )
        if num_layers is None and m.layer_axis == "moe_layers":
            raise LayoutError(
                "to_layer_axis('all_layers') from the moe_layers axis needs num_layers (the "
                "model's decoder layer count)"
            )
        if num_layers is not None:
            num_layers = as_index(num_layers, "num_layers", LayoutError)
        num_layers = m.layer_numbers[-1] if num_layers is None else num_layers
        if num_layers < m.layer_numbers[-1]:
            raise LayoutError(
                f"num_layers={num_layers} is smaller than layer {m.layer_numbers[-1]} on the "
                f"{m.layer_axis} axis"
            )
        layers = tuple(range(1, num_layers + 1))
        if m.layer_axis == "all_layers" and m.layer_numbers == layers:
            return self
        meta = dataclasses.replace(
            m,
            layer_axis="all_layers",
            layer_numbers=layers,
            moe_layer_numbers=m.routed_layer_numbers,
        )
        N, _, K = self.values_NLK.shape
        values = self.values_NLK.new_zeros((N, num_layers, K))
        dst = torch.tensor([n - 1 for n in m.routed_layer_numbers], device=dev)
        values[:, dst] = self.values_NLK.index_select(1, torch.tensor(m.moe_slots, device=dev))
        return RouteBatch._trusted(values, self.offsets_B1, self.valid_N, meta, self.ids_validated)
