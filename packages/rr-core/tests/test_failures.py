"""The failure catalogue: every code that rr's sources cite has an entry, every error message
that cites a code points to ``rr explain CODE``, and ``rr explain`` prints every entry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rr_core import FAILURE_MODES, FailureMode, failure_mode
from rr_core.cli import main as _cli
from rr_core.failures import GROUPS

from rr_core_testing import rr_without_torch

PACKAGES = Path(__file__).resolve().parents[2]
SOURCES = sorted(PACKAGES.glob("*/src/**/*.py"))
CODE = re.compile(r"\b[A-G][0-9]{1,2}\b")
_NOT_MESSAGES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While)
_NOT_MESSAGES += (ast.With, ast.Try)


def _docstrings(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _messages() -> list[tuple[str, str, set[str]]]:
    """``(where, statement source, codes)`` for each raise, warn call or message assignment
    whose string literals (docstrings aside) cite a failure code."""
    found = []
    for path in SOURCES:
        if path.name == "failures.py" or path.parts[-2:] == ("cli", "explain.py"):
            continue
        src = path.read_text()
        tree = ast.parse(src)
        docs = _docstrings(tree)
        for stmt in ast.walk(tree):
            is_warn = (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and getattr(stmt.value.func, "attr", None) == "warn"
            )
            is_message = isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("message", "msg") for t in stmt.targets
            )
            if not (isinstance(stmt, ast.Raise) or is_warn or is_message):
                continue
            strings = [
                n.value
                for n in ast.walk(stmt)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            ]
            codes = {c for s in strings for c in CODE.findall(s)}
            if codes:
                where = f"{path.relative_to(PACKAGES)}:{stmt.lineno}"
                found.append((where, ast.get_source_segment(src, stmt) or "", codes))
    return found


def test_every_code_cited_in_any_source_has_an_entry() -> None:
    cited = {c for path in SOURCES for c in CODE.findall(path.read_text())}
    assert cited, "the scan found no codes: the source layout changed?"
    assert cited <= set(FAILURE_MODES), sorted(cited - set(FAILURE_MODES))


def test_every_error_message_citing_a_code_points_to_rr_explain() -> None:
    messages = _messages()
    assert len(messages) >= 15  # rr-core, rr-megatron-compat and rr-vllm cite codes
    missing = [
        f"{where}: {sorted(code for code in codes if f'`rr explain {code}`' not in source)}"
        for where, source, codes in messages
        if any(f"`rr explain {code}`" not in source for code in codes)
    ]
    assert not missing, missing


def test_entries_are_complete_and_in_catalogue_order() -> None:
    assert list(FAILURE_MODES) == sorted(FAILURE_MODES, key=lambda c: (c[0], int(c[1:])))
    for code, entry in FAILURE_MODES.items():
        assert isinstance(entry, FailureMode)
        assert entry.code == code
        assert code[0] in GROUPS
        for text in (entry.title, entry.symptom, entry.cause, entry.handling):
            assert text.strip() == text
            assert len(text) > 10
    for letter, count in {"A": 6, "B": 5, "C": 8, "D": 8, "E": 9, "F": 4, "G": 11}.items():
        assert sum(c[0] == letter for c in FAILURE_MODES) == count


def test_lookup_ignores_case_and_spaces_and_refuses_unknown_codes() -> None:
    assert failure_mode(" e4 ") is FAILURE_MODES["E4"]
    assert failure_mode("Z9") is None
    assert failure_mode(4) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("code", list(FAILURE_MODES))
def test_rr_explain_prints_every_entry(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["explain", code.lower()]) == 0
    out = capsys.readouterr().out
    entry = FAILURE_MODES[code]
    assert out.startswith(f"{code}: {entry.title}")
    flat = " ".join(out.split())
    for text in (entry.symptom, entry.cause, entry.handling):
        assert " ".join(text.split()) in flat
    assert max(map(len, out.splitlines())) <= 96


def test_rr_explain_without_a_code_lists_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["explain"]) == 0
    out = capsys.readouterr().out
    for code, entry in FAILURE_MODES.items():
        assert f"{code:<4}{entry.title}" in out
    for group in GROUPS.values():
        assert group in out


def test_rr_explain_of_an_unknown_code_fails_listing_the_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _cli.main(["explain", "E99"]) == 2
    err = capsys.readouterr().err
    assert "no failure code 'E99'" in err
    assert "A1, A2" in err


def test_rr_explain_is_an_installed_command_that_imports_no_torch() -> None:
    done = rr_without_torch("explain", "E4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("E4: uint8 overflow")
