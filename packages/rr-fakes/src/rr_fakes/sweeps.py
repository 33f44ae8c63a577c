"""What the property sweeps of every package share (hypothesis): one settings profile, the junk
that public arguments must refuse, arrays and tensors of any dtype and shape, and calls of a
public function with every parameter drawn from them (``junk_calls``), for the entry points
whose whole invariant on such input is "a result or an RRError, never another exception".

Junk is refused easily; the near misses users produce are not (:func:`widened`,
:func:`json_text`, :func:`spellings`, :func:`byte_chunks`, :func:`just_past`): the same ids in
another dtype, JSON text where a mapping goes, another spelling of a setting, a stream in the
chunks an HTTP client yields, a limit one past its maximum. Their invariant is
:func:`right_or_named`: the right result, or an RRError naming the argument."""

from __future__ import annotations

import contextlib
import inspect
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = [
    "ANYTHING", "JUNK", "SWEEP", "adapter_refuses", "arrays", "byte_chunks", "json_text",
    "junk_calls", "just_past", "public_api_tests", "right_or_named", "spellings", "tensors",
    "widened",
]  # fmt: skip

SWEEP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Values of the wrong kind for almost any parameter: none of them is a tensor, a sequence of
#: routes, an rr object or a well-formed engine answer.
JUNK = st.sampled_from(
    [None, -1, 1.5, float("nan"), "x", "", b"\xff\xfe", [], [1, "a"], {}, object(), True, 2**70]
)


@st.composite
def arrays(draw: st.DrawFn, *, max_dims: int = 4) -> np.ndarray:
    """A numpy array of an id-like, float or bool dtype and any shape (empty sides included)."""
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.int64, np.float32, np.bool_]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=6))
    if dtype is np.bool_:
        return draw(hnp.arrays(dtype, shape))
    if dtype is np.float32:
        return draw(hnp.arrays(dtype, shape, elements=st.floats(-1, 9, width=32)))
    return draw(hnp.arrays(dtype, shape, elements=st.integers(0, 7)))


def tensors(*, max_dims: int = 4) -> st.SearchStrategy[torch.Tensor]:
    """:func:`arrays` as torch tensors."""
    return arrays(max_dims=max_dims).map(torch.from_numpy)


#: Anything a caller might pass by mistake: junk, numbers, texts, bytes that are not UTF-8,
#: arrays and tensors, lists, and mappings with the keys engine answers use.
ANYTHING: st.SearchStrategy[Any] = st.one_of(
    JUNK,
    st.integers(-3, 300),
    st.text(max_size=8),
    st.binary(max_size=8),
    arrays(),
    tensors(),
    st.lists(st.integers(-1, 9), max_size=4),
    st.lists(JUNK, max_size=3),
    st.dictionaries(
        st.sampled_from(["routed_experts", "meta_info", "token_ids", "choices", "id", "text"]),
        JUNK,
        max_size=3,
    ),
)

_DEFAULT = object()  # leave the parameter to its default


def junk_calls(
    fn: Callable[..., Any], **valid: st.SearchStrategy[Any]
) -> st.SearchStrategy[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` for ``fn``: each parameter drawn from ``valid[name]`` (default
    :data:`ANYTHING`); a parameter with a default is sometimes left out; positional-only ones
    are passed by position."""
    positional: list[st.SearchStrategy[Any]] = []
    keywords: dict[str, st.SearchStrategy[Any]] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        drawn = valid.get(name, ANYTHING)
        if p.kind is p.POSITIONAL_ONLY:
            positional.append(drawn)
        else:
            keywords[name] = drawn if p.default is p.empty else st.one_of(st.just(_DEFAULT), drawn)
    given_keywords = st.fixed_dictionaries(keywords).map(
        lambda kw: {k: v for k, v in kw.items() if v is not _DEFAULT}
    )
    return st.tuples(st.tuples(*positional), given_keywords)


def public_api_tests(
    package: ModuleType,
    *,
    swept_above: Iterable[str],
    swept_with_junk: Sequence[str],
    not_swept: Mapping[str, str],
    **valid: st.SearchStrategy[Any],
) -> tuple[Callable[..., None], Callable[[], None]]:
    """The two tests each package's sweep ends with (assign them to ``test_*`` names):

    - every name of ``swept_with_junk`` called with :func:`junk_calls` (``valid`` as there), in a
      fresh empty directory (paths among the junk must not litter the tree), gives a result or
      an RRError (a context manager it returns is entered too);
    - ``swept_above`` (the entry points the module's own sweeps check for their invariant),
      ``swept_with_junk`` and ``not_swept`` (name -> why it takes no outside data) together are
      exactly ``package.__all__``, so a new public name cannot go unswept unnoticed.
    """
    import pytest

    from rr_fakes.pytest_support import settles

    @pytest.mark.parametrize("name", swept_with_junk)
    @SWEEP
    @given(data=st.data())
    def refuses_junk(name: str, data: st.DataObject) -> None:
        entry = getattr(package, name)
        args, kwargs = data.draw(junk_calls(entry, **valid))
        with tempfile.TemporaryDirectory() as empty, contextlib.chdir(empty):
            ok, result = settles(entry, *args, **kwargs)
            if ok and hasattr(result, "__enter__") and hasattr(result, "__exit__"):
                entered, _ = settles(result.__enter__)
                if entered:
                    result.__exit__(None, None, None)

    def names_every_public_name() -> None:
        named = [*swept_above, *swept_with_junk, *not_swept]
        public = list(package.__all__)
        assert sorted(named) == sorted(public), set(named) ^ set(public)

    return refuses_junk, names_every_public_name


def adapter_refuses(
    adapter: ModuleType, controller: Any, model: Any, force: Any, **options: Any
) -> None:
    """An adapter's module functions on a ``model`` without routers (or not a model at all):
    ``attach`` refuses with an rr error, ``detach`` settles, and ``install`` refuses a ``force``
    that is not a bool."""
    from rr_fakes.pytest_support import settles

    ok, _ = settles(adapter.attach, controller, model, **options)
    assert not ok  # no model here has a router
    settles(adapter.detach, controller)
    if not isinstance(force, bool):
        ok, _ = settles(adapter.install, force=force)
        assert not ok


# --- near misses: plausible wrong data, not junk ------------------------------------------------

#: The dtypes a tensor of ids may arrive in after a framework touched it.
ID_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64)


def widened(value: torch.Tensor | np.ndarray) -> st.SearchStrategy[Any]:
    """``value``'s numbers in another dtype (widened, narrowed, or floats), as a collate, a
    ``torch.tensor(list)`` or a JSON round trip leaves them; numpy stays numpy."""
    if isinstance(value, np.ndarray):
        return widened(torch.from_numpy(value)).map(lambda t: t.numpy())
    others = [d for d in ID_DTYPES if d != value.dtype]
    return st.sampled_from(others).map(value.to)


def json_text(value: Any) -> st.SearchStrategy[str | bytes]:
    """``value`` as the JSON text a caller holds instead of the parsed object: ``resp.text``,
    ``resp.content``, a CLI flag's value (padded with whitespace)."""
    text = json.dumps(value)
    return st.sampled_from([text, f" {text}\n", text.encode()])


def spellings(word: str) -> st.SearchStrategy[str]:
    """Other spellings of an enum-like setting: case, ``-`` for ``_`` (and back), padding."""
    forms = {
        word.upper(),
        word.capitalize(),
        word.replace("_", "-"),
        word.replace("-", "_"),
        f" {word}",
        f"{word} ",
    }
    return st.sampled_from(sorted(forms - {word}) or [word.upper()])


def byte_chunks(raw: bytes, *, max_cuts: int = 24) -> st.SearchStrategy[list[bytes]]:
    """``raw`` cut at any positions, as ``iter_content`` / ``aiter_bytes`` yield a body: cuts
    mid-line and mid-character included."""
    if len(raw) < 2:
        return st.just([raw])
    cuts = st.lists(st.integers(1, len(raw) - 1), unique=True, max_size=max_cuts).map(sorted)
    return cuts.map(lambda c: [raw[a:b] for a, b in zip([0, *c], [*c, len(raw)], strict=True)])


def just_past(limit: int) -> st.SearchStrategy[int]:
    """Values just past an inclusive maximum (one past, a few past, twice it)."""
    return st.sampled_from(sorted({limit + 1, limit + 2, limit + 7, 2 * limit + 1}))


def right_or_named(
    call: Callable[[], Any],
    *names: str,
    right: Callable[[Any], bool] | None = None,
) -> Any:
    """Run ``call``: it gives the right result (``right(result)`` holds; any result when None)
    or raises an RRError whose message names one of ``names`` (the argument, or what is wrong
    with it). Any other exception propagates: a foreign error fails the sweep. Returns the
    result, or None when refused."""
    from rr_core import RRError

    refused: RRError | None = None
    try:
        result = call()
    except RRError as e:
        refused = e
    if refused is not None:
        text = str(refused).lower()
        named = any(n.lower() in text for n in names)
        assert named, f"{type(refused).__name__} names none of {names}: {refused}"
        return None
    if right is not None:
        assert right(result), f"a wrong result, not refused: {result!r:.200}"
    return result
