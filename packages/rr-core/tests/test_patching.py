"""rr_core.patching: what rr sets on foreign objects comes off again, and only what rr set."""

from __future__ import annotations

import types

from hypothesis import given
from hypothesis import strategies as st

from rr_core.patching import Patches


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
