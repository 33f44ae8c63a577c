"""Compact routes for verl: ship rr's codec payload instead of verl's int16 ``routed_experts``,
and expand it into exactly the tensor verl's trainer consumes.

Shape legend: B samples, T tokens of a sample (prompt + response), P prompt tokens, G response
tokens, N rows of a batch (every token of every sample), L layer slots (all_layers axis), K top-k,
S = prompt_length + response_length.

verl 0.9.1 turns each sample's engine array (``[T - 1, L, K]`` rows, prompt first, every decoder
layer) into int16 and lays it out in one of two ways:

- ``AgentLoopOutput.as_dict`` (the TransferQueue trainer): ``[T, L, K]`` int16, the engine's rows
  at the top, zeros below (the last token's row among them); a batch of such samples is a jagged
  nested ``[B, j, L, K]`` tensor (``list_of_dict_to_tensordict``), the ``routed_experts`` field
  the Megatron engine reads for R3.
- ``AgentLoopWorker._agent_loop_postprocess`` + ``_postprocess`` (the DataProto trainer):
  ``[B, S, L, K]`` int16, sample b's rows starting at ``prompt_length - P_b`` (under its
  left-padded prompt), zeros elsewhere; ``left_right_2_no_padding`` then cuts it to the same
  jagged tensor with the attention mask.

:func:`to_verl_nested` and :func:`to_verl_padded` build both from a :class:`VerlRoutes`, bit for
bit (the ``set`` codec returns each row's K ids sorted). verl's R3 replay mask covers every row
of a sample but its last, so a row without a route (a token after a multi-turn trajectory's last
generation, an aborted sample, rows before ``routed_experts_prompt_start``) would be replayed as
expert 0 repeated K times: both refuse such batches unless ``strict=False``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rr_core import (
    AlignmentError,
    CodecError,
    EncodedRoutes,
    RouteBatch,
    RouteMeta,
    decode_routes,
    decode_routes_into,
    encode_routes,
)
from rr_core.buffers import zeros
from rr_core.checks import check_flag, check_instance, check_sequence
from rr_core.codecs.encoding import (
    check_codec,
    pack_valid,
    unpack_valid,
)
from rr_vllm.assemble import to_trainer_layout, truncate_response
from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import integers
from rr_vllm.samples import SampleRoutes, check_samples
from rr_vllm.validate import check_all_layers, validate_samples

#: The dtype of verl's ``routed_experts`` tensor.
VERL_DTYPE = torch.int16


@dataclass(frozen=True, kw_only=True, eq=False)
class VerlRoutes:
    """Validated routes of B samples in codec form, with what verl's layouts need besides.

    ``encoded`` holds the payload (MoE slots of rows that carry a route), the validity bits, the
    per-sample offsets and the :class:`~rr_core.RouteMeta` (experts, top-k, which slots are
    dense); ``num_prompt_tokens`` is P of each sample. Plain tensors and tuples, so it pickles
    (Ray, TransferQueue non-tensor fields) at its compact size.
    """

    encoded: EncodedRoutes
    num_prompt_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        takes = "VerlRoutes.encoded must be the EncodedRoutes encode_routes returns"
        check_instance(self.encoded, EncodedRoutes, CodecError, takes)
        for name in ("payload", "valid_bits"):  # bytes, whatever the codec: they travel by Ray
            field = getattr(self.encoded, name)
            if not isinstance(field, torch.Tensor) or field.dtype != torch.uint8:
                raise CodecError(
                    f"VerlRoutes.encoded.{name} must be a uint8 tensor (the codec's bytes); got "
                    f"{getattr(field, 'dtype', type(field).__name__)}: encode with encode_routes"
                )
        lengths = self.encoded.offsets_B1.diff().tolist()
        prompts = tuple(integers(self.num_prompt_tokens, "num_prompt_tokens", error=AlignmentError))
        object.__setattr__(self, "num_prompt_tokens", prompts)
        if len(prompts) != len(lengths):
            raise AlignmentError(f"{len(prompts)} prompt lengths for {len(lengths)} samples")
        for b, (p, t) in enumerate(zip(prompts, lengths, strict=True)):
            if not 0 <= p <= t:
                raise AlignmentError(f"sample {b} has {t} tokens, so P={p} is outside 0..{t}")

    @property
    def meta(self) -> RouteMeta:
        return self.encoded.meta

    @property
    def codec(self) -> str:
        return self.encoded.codec

    @property
    def num_samples(self) -> int:
        return self.encoded.offsets_B1.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.encoded.num_rows

    @property
    def lengths(self) -> tuple[int, ...]:
        """T of each sample (prompt + response tokens)."""
        return tuple(self.encoded.offsets_B1.diff().tolist())

    @property
    def nbytes(self) -> int:
        """Payload, validity bits, offsets and prompt lengths together."""
        return self.encoded.nbytes + 8 * len(self.num_prompt_tokens)

    @property
    def bytes_per_token(self) -> float:
        """Measured payload plus validity bytes per token."""
        return self.encoded.bytes_per_token

    @property
    def verl_bytes_per_token(self) -> int:
        """What verl's int16 tensor costs per token: ``L * K * 2``."""
        return len(self.meta.layer_numbers) * self.meta.top_k * VERL_DTYPE.itemsize


def pack_for_verl(
    samples: Sequence[SampleRoutes | None],
    meta: RouteMeta,
    *,
    codec: str = "packed",
    response_length: int | None = None,
    allow_all_zero: bool = False,
    allow_physical: bool = False,
    logical_experts: int | None = None,
) -> VerlRoutes:
    """Decoded samples (:func:`~rr_vllm.decode_vllm_output`, :func:`~rr_vllm.decode_vllm_http`,
    :func:`~rr_vllm.decode_sglang`, assembled or not) as validated :class:`VerlRoutes`.

    ``response_length`` cuts each response and its routes as verl's agent loops do
    (``response_ids[:response_length]``). Validation is :func:`~rr_vllm.validate_samples`': ids
    in range, K distinct ids, empty dense slots, no all-zero capture (E1), physical ids (E2);
    each raises an rr error naming sample, row and layer.
    """
    samples = check_samples(samples, "pack_for_verl's samples")
    if response_length is not None:
        samples = [None if s is None else truncate_response(s, response_length) for s in samples]
    batch = validate_samples(
        samples,
        meta,
        allow_all_zero=allow_all_zero,
        allow_physical=allow_physical,
        logical_experts=logical_experts,
    )
    prompts = [s.num_prompt_tokens for s in samples if s is not None]
    return _wrap(batch, prompts, codec)


def pack_batch_for_verl(
    batch: RouteBatch,
    num_prompt_tokens: Sequence[int] | torch.Tensor,
    *,
    codec: str = "packed",
    validate: bool = True,
    allow_all_zero: bool = False,
) -> VerlRoutes:
    """An all-layers :class:`~rr_core.RouteBatch` (such as :meth:`~rr_vllm.DecodedRoutes.to_batch`
    returns) and each sample's P as :class:`VerlRoutes`. ``validate=False`` skips rr_core's
    id checks for a batch that was validated when it was built (``to_batch()``'s is)."""
    takes = "pack_batch_for_verl takes a RouteBatch (DecodedRoutes.to_batch() returns one)"
    check_instance(batch, RouteBatch, EngineOutputError, takes)
    check_all_layers(batch.meta)
    if check_flag(validate, "validate", EngineOutputError):
        batch.validate(allow_all_zero=allow_all_zero)
    prompts = integers(num_prompt_tokens, "num_prompt_tokens", error=AlignmentError)
    return _wrap(batch, prompts, codec)


def _wrap(batch: RouteBatch, prompts: Sequence[int], codec: str) -> VerlRoutes:
    if batch.values_NLK.device.type != "cpu":
        batch = batch.to("cpu")  # the payload ships from the host
    return VerlRoutes(
        encoded=encode_routes(batch, check_codec(codec)), num_prompt_tokens=tuple(prompts)
    )


def concat_verl_routes(parts: Sequence[VerlRoutes]) -> VerlRoutes:
    """Samples of several :class:`VerlRoutes` (one per agent-loop sample, say) in order, as one.

    Payloads are joined byte for byte when every part but the last holds a multiple of 8 fields
    (always for ``raw``; for ``packed`` when valid rows x MoE slots x K is, for ``set`` when
    valid rows x MoE slots is: every sample of a model with a multiple of 8 MoE layers);
    otherwise the parts are decoded and encoded again.
    """
    parts = check_sequence(parts, "concat_verl_routes' parts", CodecError, of=VerlRoutes)
    if not parts:
        raise AlignmentError("concat_verl_routes needs at least one part")
    first: VerlRoutes = parts[0]
    for i, p in enumerate(parts[1:], start=1):
        if p.meta != first.meta or p.codec != first.codec:
            raise CodecError(
                f"part {i} has codec {p.codec!r} and meta {p.meta}; part 0 has codec "
                f"{first.codec!r} and meta {first.meta}: encode every part alike"
            )
    if len(parts) == 1:
        return first
    valid = [unpack_valid(p.encoded.valid_bits, p.num_tokens) for p in parts]
    offsets = [first.encoded.offsets_B1]
    base = int(first.encoded.offsets_B1[-1])
    for p in parts[1:]:
        offsets.append(p.encoded.offsets_B1[1:] + base)
        base += int(p.encoded.offsets_B1[-1])
    prompts = tuple(itertools.chain.from_iterable(p.num_prompt_tokens for p in parts))
    fields_per_row = len(first.meta.moe_slots) * (first.meta.top_k if first.codec != "set" else 1)
    if first.codec == "raw" or all(int(v.sum()) * fields_per_row % 8 == 0 for v in valid[:-1]):
        encoded = EncodedRoutes(
            codec=first.encoded.codec,
            meta=first.meta,
            num_rows=base,
            offsets_B1=torch.cat(offsets),
            valid_bits=pack_valid(torch.cat(valid)),
            payload=torch.cat([p.encoded.payload for p in parts]),
        )
        return VerlRoutes(encoded=encoded, num_prompt_tokens=prompts)
    batches = [decode_routes(p.encoded) for p in parts]
    values = torch.cat([b.values_NLK for b in batches])
    joined = RouteBatch(values, torch.cat(offsets), torch.cat(valid), first.meta, validate=False)
    return VerlRoutes(encoded=encode_routes(joined, first.codec), num_prompt_tokens=prompts)


def _verl_routes(value: object, where: str) -> VerlRoutes:
    takes = f"{where} takes the VerlRoutes pack_for_verl returns"
    return check_instance(value, VerlRoutes, EngineOutputError, takes)


def unreplayable_rows(routes: VerlRoutes) -> list[tuple[int, list[int]]]:
    """``(sample, token rows)`` that verl's R3 replay mask (every row of a sample with response
    tokens, but its last) would replay although they carry no route, so verl would force expert
    0, K times, on them."""
    routes = _verl_routes(routes, "unreplayable_rows")
    valid_N = unpack_valid(routes.encoded.valid_bits, routes.num_tokens)
    out: list[tuple[int, list[int]]] = []
    offsets = routes.encoded.offsets_B1.tolist()
    for b, (start, end) in enumerate(itertools.pairwise(offsets)):
        if end - start <= routes.num_prompt_tokens[b]:
            continue  # no response tokens: verl replays nothing
        missing = (~valid_N[start : end - 1]).nonzero()[:, 0]
        if missing.numel():
            out.append((b, missing.tolist()))
    return out


def check_verl_replayable(routes: VerlRoutes) -> None:
    """Raise :class:`~rr_vllm.EngineOutputError` naming the first sample whose rows verl's R3
    replay would consume without a route (see :func:`unreplayable_rows`)."""
    bad = unreplayable_rows(routes)
    if bad:
        b, rows = bad[0]
        shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
        raise EngineOutputError(
            f"sample {b} (P={routes.num_prompt_tokens[b]}, T={routes.lengths[b]}): token rows "
            f"[{shown}] ({len(rows)} in all, {len(bad)} samples affected) carry no route, but "
            "verl's R3 replay mask replays every row but a sample's last, so it would force "
            "expert 0 on them K times. Typical causes: tool tokens after a multi-turn "
            "trajectory's last generation, a masked aborted request, routed_experts_prompt_start"
            " > 0. Drop or re-roll those samples, or pass strict=False to accept it"
        )


def to_verl_nested(
    routes: VerlRoutes, *, device: torch.device | str | None = None, strict: bool = True
) -> torch.Tensor:
    """verl's trainer field ``routed_experts``: a jagged nested ``[B, j, L, K]`` int16 tensor on
    ``device``, sample b holding ``T_b`` rows (zeros where no route, the last row among them),
    equal to what ``AgentLoopOutput.as_dict`` and ``list_of_dict_to_tensordict`` (or
    ``left_right_2_no_padding`` of the padded batch) produce from the same engine output.

    Only the compact payload moves to ``device``; the int16 ids are expanded there.
    ``strict``: see :func:`check_verl_replayable`.
    """
    routes = _verl_routes(routes, "to_verl_nested")
    if check_flag(strict, "strict", EngineOutputError):
        check_verl_replayable(routes)
    encoded, meta = routes.encoded, routes.meta
    dev = encoded.payload.device if device is None else torch.device(device)
    out_NLK = zeros((encoded.num_rows, len(meta.layer_numbers), meta.top_k), VERL_DTYPE, dev)
    values_NLK = decode_routes_into(encoded, out_NLK)  # each id written once, in int16
    return torch.nested.nested_tensor_from_jagged(values_NLK, encoded.offsets_B1.to(dev))


def to_verl_padded(
    routes: VerlRoutes,
    *,
    prompt_length: int,
    response_length: int,
    device: torch.device | str | None = None,
    strict: bool = True,
) -> torch.Tensor:
    """The padded ``[B, prompt_length + response_length, L, K]`` int16 tensor that verl's
    ``AgentLoopWorker._postprocess`` stores under ``batch["routed_experts"]``: sample b's rows
    from position ``prompt_length - P_b`` on, zeros elsewhere. Responses longer than
    ``response_length`` raise (pack with ``response_length`` to cut them as verl does)."""
    routes = _verl_routes(routes, "to_verl_padded")
    if check_flag(strict, "strict", EngineOutputError):
        check_verl_replayable(routes)
    batch = decode_routes(routes.encoded, device=device)
    return to_trainer_layout(
        batch,
        list(routes.num_prompt_tokens),
        prompt_length=prompt_length,
        response_length=response_length,
        dtype=VERL_DTYPE,
    ).routes_BSLK
