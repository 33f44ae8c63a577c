"""rr_core.patching: what rr sets on foreign objects comes off again, and only what rr set."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from rr_core.patching import Patches, RRWrapper


class Owner:
    inherited = "base"


def test_restore_puts_back_originals_and_removes_what_was_absent() -> None:
    module = types.SimpleNamespace(op="original")
    cls = type("Child", (Owner,), {})
    patches = Patches()
    patches.set(module, "op", "rr")
    patches.set(cls, "inherited", "rr")  # only inherited before: the class's own slot is new
    assert (module.op, cls.inherited, patches.in_place(), len(patches)) == ("rr", "rr", True, 2)
    assert list(patches) == [(module, "op"), (cls, "inherited")]
    assert patches.holds(module, "op")
    assert not patches.holds(module, "other")
    assert patches.restore() == 2
    assert (module.op, cls.inherited, "inherited" in vars(cls)) == ("original", "base", False)
    assert (len(patches), patches.in_place(), patches.restore()) == (0, False, 0)


def test_a_patch_over_rr_is_never_undone() -> None:
    module = types.SimpleNamespace(op="original", other="x")
    patches = Patches()
    patches.set(module, "op", "rr")
    patches.set(module, "other", "rr")
    module.op = "theirs"
    assert not patches.in_place()
    assert patches.restore() == 1
    assert (module.op, module.other) == ("theirs", "x")


def test_forced_restore_puts_the_originals_back_over_later_changes() -> None:
    module = types.SimpleNamespace(flag=False)
    patches = Patches()
    patches.set(module, "flag", True)
    patches.set(module, "added", 1)
    module.flag, module.added = "changed", 2
    assert patches.restore(force=True) == 2
    assert vars(module) == {"flag": False}


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=8))
def test_stacked_patches_unwind_to_the_start(names: list[str]) -> None:
    module = types.SimpleNamespace(a=0, b=1)
    before = dict(vars(module))
    patches = Patches()
    for i, name in enumerate(names):
        patches.set(module, name, f"rr{i}")
    assert patches.restore() == len(names)
    assert vars(module) == before


def test_a_wrapper_dropped_by_a_repatch_is_replaced_and_uninstall_leaves_the_repatch() -> None:
    from rr_core.patching import RRWrapper

    def op() -> str:
        return "original"

    def theirs() -> str:
        return "theirs"

    def louder(wrapped, instance, args, kwargs):  # type: ignore[no-untyped-def]
        return wrapped(*args, **kwargs).upper()

    module = types.SimpleNamespace(op=op)
    patches = Patches()
    first = patches.wrap(module, "op", louder)
    assert patches.wrap(module, "op", louder) is first  # already rr's: nothing wrapped twice
    module.op = theirs  # another library's re-patch drops rr's wrapper
    assert not patches.in_place()
    second = patches.wrap(module, "op", louder)
    assert (module.op(), patches.in_place(), len(patches)) == ("THEIRS", True, 1)
    assert not first.rr_active  # the dropped wrapper passes calls through
    assert patches.restore() == 1
    assert module.op is theirs  # their re-patch stays: rr puts back what it wrapped
    assert isinstance(second, RRWrapper)
    assert not second.rr_active


def _louder(wrapped, instance, args, kwargs):  # type: ignore[no-untyped-def]
    return wrapped(*args, **kwargs).upper()


def _op() -> str:
    return "original"


@contextlib.contextmanager
def _loaded(**modules: dict[str, object]) -> Iterator[dict[str, types.ModuleType]]:
    """Modules in ``sys.modules`` for one test, each holding the given names."""
    made = {}
    for name, names in modules.items():
        made[name] = types.ModuleType(f"rrtest_{name}")
        vars(made[name]).update(names)
        sys.modules[f"rrtest_{name}"] = made[name]
    try:
        yield made
    finally:
        for name in modules:
            sys.modules.pop(f"rrtest_{name}", None)


def test_set_copies_hooks_every_by_name_copy_and_restore_puts_each_back() -> None:
    def theirs(*args: object) -> str:  # another library's wrapper over the op
        return str(_op())

    with _loaded(home={"op": _op}, a={"op": _op}, b={"op": _op}, other={"op": theirs}) as m:
        patches = Patches()
        proxy = RRWrapper(_op, _louder, name="op")
        assert patches.set_copies(_op, proxy, "op", within=lambda n: n.startswith("rrtest_")) == 3
        assert [m[k].op() for k in ("home", "a", "b", "other")] == [
            "ORIGINAL", "ORIGINAL", "ORIGINAL", "original"
        ]  # fmt: skip
        assert m["other"].op is theirs  # a foreign value under the name is not rr's to replace
        assert patches.set_copies(_op, proxy, "op") == 3  # again: nothing recorded twice
        assert len(patches) == 3
        assert patches.restore() == 3
        assert all(m[k].op is _op for k in ("home", "a", "b"))


def test_set_copies_replaces_a_proxy_an_earlier_uninstall_left_passing_through() -> None:
    """A module imported while an earlier install was in place copied that install's proxy,
    which passes through since its uninstall: the next install must hook it again."""
    with _loaded(home={"op": _op}) as m:
        first = Patches()
        old = RRWrapper(_op, _louder, name="op")
        first.set_copies(_op, old, "op", within=lambda n: n.startswith("rrtest_"))
        with _loaded(late={"op": old}) as late:  # imported while installed
            first.restore()
            assert late["late"].op() == "original"  # the stale proxy passes through
            second = Patches()
            new = RRWrapper(_op, _louder, name="op")
            assert second.set_copies(_op, new, "op", within=lambda n: n.startswith("rrtest_")) == 2
            assert late["late"].op is new
            assert m["home"].op is new
            assert second.restore() == 2
            assert late["late"].op is old  # what was there goes back
            old_active = RRWrapper(_op, _louder, name="active")
            late["late"].op = old_active  # an active proxy (another install's) is left alone
            assert second.set_copies(_op, new, "op", within=lambda n: n == "rrtest_late") == 0
            assert late["late"].op is old_active


def test_restore_copies_puts_the_original_back_in_copies_taken_while_rr_was_set() -> None:
    """``from module import op`` while rr's value was in place: no patch recorded that copy,
    so :meth:`Patches.restore` cannot put it back; :meth:`Patches.restore_copies` does."""
    within = lambda n: n.startswith("rrtest_")  # noqa: E731
    with _loaded(home={"op": _op}) as m:
        patches = Patches()
        proxy = RRWrapper(_op, _louder, name="op")
        patches.set_copies(_op, proxy, "op", within=within)
        with _loaded(late={"op": proxy}, foreign={"op": str}) as late:  # imported while installed
            assert patches.restore_copies(proxy, _op, "op", within=within) == 1  # not home's
            assert late["late"].op is _op
            assert m["home"].op is proxy  # recorded: restore's to put back
            assert late["foreign"].op is str  # not rr's value: left
            assert patches.restore() == 1
            assert m["home"].op is _op
            assert patches.restore_copies(proxy, _op, "op", within=within) == 0
