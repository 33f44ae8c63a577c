"""rr_fakes.hf_to_megatron is the one public path of the Hugging Face -> Megatron conversion: its
old paths answer each public name for one release with a DeprecationWarning naming the new path,
and the harness's old path says where it went."""

from __future__ import annotations

import importlib

import pytest

import rr_fakes.hf_to_megatron as public
from rr_fakes.megatron import MOVED


def test_the_public_module_exports_every_name_it_lists() -> None:
    for name in public.__all__:
        assert getattr(public, name) is not None, name


@pytest.mark.parametrize(("old", "name"), [(o, n) for o, names in MOVED.items() for n in names])
def test_an_old_path_warns_naming_the_new_one_and_answers_the_same_object(
    old: str, name: str
) -> None:
    module = importlib.import_module(f"rr_fakes.megatron.{old}")
    with pytest.warns(DeprecationWarning, match=rf"moved to rr_fakes\.hf_to_megatron\.{name}"):
        value = getattr(module, name)
    assert value is getattr(public, name)


def test_names_the_old_modules_never_had_are_refused() -> None:
    module = importlib.import_module("rr_fakes.megatron.hf_loader")
    with pytest.raises(AttributeError, match="no attribute 'CPUGroupedLinear'"):
        module.CPUGroupedLinear  # noqa: B018


def test_the_moved_harness_names_its_new_path() -> None:
    import rr_fakes.megatron as old

    with pytest.raises(AttributeError, match=r"moved to rr_fakes\.shims\.megatron"):
        old.model_parallel  # noqa: B018
