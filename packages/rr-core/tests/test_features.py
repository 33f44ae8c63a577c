"""rr_core.feature_flags: one rule from a version and a feature table to an adapter's flags."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from packaging.version import Version

from rr_core.features import feature_flags

FEATURES = {"native": ">=0.16", "broken": ">=0.16,<0.20"}


@dataclass(frozen=True)
class Flags:
    version: Version
    native: bool
    broken: bool


@pytest.mark.parametrize(
    ("release", "native", "broken"),
    [
        ("0.15.3", False, False),
        ("0.16.0", True, True),
        ("0.19.2", True, True),
        ("0.20.0", True, False),
    ],
)
def test_each_feature_is_its_specifier_on_the_release(
    release: str, native: bool, broken: bool
) -> None:
    v = Version(release)
    assert feature_flags(Flags, FEATURES, v, version=v) == Flags(v, native, broken)


def test_a_table_and_a_class_that_disagree_are_refused_naming_the_difference() -> None:
    v = Version("0.16.0")
    with pytest.raises(TypeError, match=r"missing \['new'\], extra \[\]"):
        feature_flags(Flags, {**FEATURES, "new": ">=1"}, v, version=v)
    with pytest.raises(TypeError, match=r"missing \[\], extra \['broken'\]"):
        feature_flags(Flags, {"native": ">=0.16"}, v, version=v)
