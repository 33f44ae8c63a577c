"""What every decoder returns: the samples of an answer, in order, and the batch they make; and
the decoder of one bare all-layers array, the building block of the others.

Shape legend as in :mod:`rr_vllm.samples`. A :class:`DecodedRoutes` is a sequence of
:class:`~rr_vllm.SampleRoutes` (None where an aborted request was dropped), one per completion,
choice or envelope, request-major, carried with the :class:`~rr_vllm.DecodeOptions` they were
decoded with; ``to_batch()`` is the validated :class:`~rr_core.RouteBatch` under those options'
batch checks. Answers of one rollout decoded apart join with ``+`` (the same options).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Unpack, overload

from rr_core import RouteBatch, RouteMeta
from rr_vllm.errors import EngineOutputError
from rr_vllm.options import DecodeKeywords, DecodeOptions, resolve
from rr_vllm.samples import BoolArray, IntArray, SampleRoutes, check_samples, decode_rows, sample_of
from rr_vllm.validate import batch_decoded


class DecodedRoutes(Sequence[SampleRoutes | None]):
    """The samples a decoder read from an answer (index it, iterate it), and ``to_batch()``."""

    __slots__ = ("_samples", "options")

    def __init__(self, samples: Sequence[SampleRoutes | None], options: DecodeOptions) -> None:
        if not isinstance(options, DecodeOptions):
            raise EngineOutputError(
                f"DecodedRoutes takes the DecodeOptions it was decoded with; got "
                f"{type(options).__name__}"
            )
        #: None in a subclass that decodes on first read (and sets it then)
        self._samples: list[SampleRoutes | None] | None = check_samples(
            samples, "DecodedRoutes' samples"
        )
        self.options = options

    @property
    def samples(self) -> list[SampleRoutes | None]:
        """The samples, as a list (decoded now where a subclass decodes on first read)."""
        assert self._samples is not None  # a subclass that decodes late sets it first
        return self._samples

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, index: int) -> SampleRoutes | None: ...
    @overload
    def __getitem__(self, index: slice) -> list[SampleRoutes | None]: ...
    def __getitem__(self, index: int | slice) -> SampleRoutes | list[SampleRoutes | None] | None:
        return self.samples[index]

    def __iter__(self) -> Iterator[SampleRoutes | None]:
        return iter(self.samples)

    def __add__(self, other: object) -> DecodedRoutes:
        if not isinstance(other, DecodedRoutes) or other.options != self.options:
            raise EngineOutputError(
                "DecodedRoutes join with DecodedRoutes of the same DecodeOptions; got "
                f"{type(other).__name__}"
                + (" of other options" if isinstance(other, DecodedRoutes) else "")
            )
        return DecodedRoutes([*self.samples, *other.samples], self.options)

    def __repr__(self) -> str:
        return f"DecodedRoutes({len(self)} samples, meta={self.options.meta!r})"

    def only(self) -> SampleRoutes | None:
        """The sample of a one-sample answer (an SGLang ``/generate`` answer, a bare array, an
        envelope); more or fewer raise."""
        if len(self) != 1:
            raise EngineOutputError(f"only() reads a one-sample answer; this one has {len(self)}")
        return self.samples[0]

    def to_batch(self) -> RouteBatch:
        """The samples as one validated all-layers :class:`~rr_core.RouteBatch` (the options'
        ``allow_all_zero``, ``allow_physical``, ``logical_experts``, ``validate``). A dropped
        sample (None) raises: its tokens would still be in the token batch."""
        return batch_decoded(self.samples, self.options)


#: The options a decoder of one array reads.
READS = frozenset({"prompt_start", "on_abort", "engine_config"})


def decode_routes_array(
    routes: Any,
    options: DecodeOptions | RouteMeta,
    /,
    *,
    num_prompt_tokens: int,
    num_generated_tokens: int,
    finish_reason: str | None = None,
    what: str = "routes",
    out: tuple[IntArray, BoolArray] | None = None,
    **keywords: Unpack[DecodeKeywords],
) -> DecodedRoutes:
    """One all-layers ``[N, L, K]`` array (or None) of a sample with P prompt and G generated
    tokens, rows from ``prompt_start`` (options: ``prompt_start``, ``on_abort``). An aborted
    sample (``finish_reason == "abort"``) is masked (every row invalid) or dropped (None);
    otherwise None routes raise (D3). ``out``: see :func:`~rr_vllm.samples.place_rows` (a
    masked sample zeroes it). The deprecated form (a RouteMeta, option keywords) returns the
    sample itself."""
    opts, legacy = resolve(options, keywords, reads=READS, decoder="decode_routes_array")
    sample = sample_of(
        what,
        num_prompt_tokens,
        num_generated_tokens,
        prompt_start=opts.prompt_start,
        finish_reason=finish_reason,
    )
    decoded = decode_rows(routes, sample, opts, out=out)
    return decoded if legacy else DecodedRoutes([decoded], opts)  # type: ignore[return-value]


def decoded(
    samples: list[SampleRoutes | None], options: DecodeOptions, legacy: bool
) -> DecodedRoutes:
    """What a decoder returns: :class:`DecodedRoutes`, or the deprecated form's list."""
    return samples if legacy else DecodedRoutes(samples, options)  # type: ignore[return-value]


def decoded_one(sample: SampleRoutes | None, options: DecodeOptions, legacy: bool) -> DecodedRoutes:
    """What a one-sample decoder returns: :class:`DecodedRoutes` of one sample, or the
    deprecated form's sample (None where dropped)."""
    return sample if legacy else DecodedRoutes([sample], options)  # type: ignore[return-value]
