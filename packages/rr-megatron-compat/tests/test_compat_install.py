"""install() / uninstall() as a state machine, the supported range, lazy imports, and C6."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import wrapt
from packaging.version import Version

import rr_megatron_compat as rmc
from rr_megatron_compat import _versions


@pytest.fixture
def cpu() -> Iterator[None]:
    from rr_fakes.shims.megatron import megatron_cpu

    with megatron_cpu():
        yield


def _raw(spec: Any) -> Any:
    module = importlib.import_module(spec.module)
    owner = module if spec.owner is None else getattr(module, spec.owner)
    return vars(owner)[spec.attribute]


def _specs() -> tuple[Any, ...]:
    return rmc.hook_specs(rmc.megatron_line())


def test_install_twice_uninstall_twice(cpu: None) -> None:
    originals = [_raw(s) for s in _specs()]
    names = rmc.install()
    proxies = [_raw(s) for s in _specs()]
    assert all(isinstance(p, rmc.RRProxy) for p in proxies)
    assert rmc.is_installed()
    assert rmc.install() == names  # idempotent by identity: same proxies, no double wrap
    assert [_raw(s) for s in _specs()] == proxies
    assert all(p.__wrapped__ is o for p, o in zip(proxies, originals, strict=True))
    assert rmc.uninstall() == len(names)
    assert [_raw(s) for s in _specs()] == originals
    assert not rmc.is_installed()
    assert rmc.uninstall() == 0
    assert [_raw(s) for s in _specs()] == originals


def test_signatures_stay_intact(cpu: None) -> None:
    before = [inspect.signature(_raw(s)) for s in _specs()]
    rmc.install()
    try:
        assert [inspect.signature(_raw(s)) for s in _specs()] == before
    finally:
        rmc.uninstall()


def _foreign(wrapped: Any) -> Any:
    @wrapt.decorator  # type: ignore[misc]
    def foreign(w: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return w(*args, **kwargs)

    return foreign(wrapped)


def _set(spec: Any, value: Any) -> None:
    module = importlib.import_module(spec.module)
    owner = module if spec.owner is None else getattr(module, spec.owner)
    setattr(owner, spec.attribute, value)


def test_reinstall_after_a_foreign_repatch_that_dropped_rr(cpu: None) -> None:
    """MindSpeed's repatch() puts its own patch back, dropping patches installed in between."""
    originals = [_raw(s) for s in _specs()]
    rmc.install()
    try:
        for spec, original in zip(_specs(), originals, strict=True):
            _set(spec, _foreign(original))  # rr's proxy is gone
        assert not rmc.is_installed()
        rmc.install()
        assert rmc.is_installed()
        for spec, original in zip(_specs(), originals, strict=True):
            raw = _raw(spec)
            assert isinstance(raw, rmc.RRProxy)
            assert raw.__wrapped__.__wrapped__ is original
    finally:
        rmc.uninstall()
    for spec in _specs():  # the foreign patch stays
        assert not isinstance(_raw(spec), rmc.RRProxy)
        _set(spec, _raw(spec).__wrapped__)
    assert [_raw(s) for s in _specs()] == originals


def test_foreign_wrap_over_rr_is_kept_and_rr_disabled_on_uninstall(cpu: None) -> None:
    originals = [_raw(s) for s in _specs()]
    rmc.install()
    for spec in _specs():
        _set(spec, _foreign(_raw(spec)))
    assert rmc.is_installed()  # rr's proxy is still in the chain
    rmc.install()  # no second rr proxy
    assert all(not isinstance(_raw(s), rmc.RRProxy) for s in _specs())
    with pytest.warns(UserWarning, match="wrapped again by another library"):
        rmc.uninstall()
    assert not rmc.is_installed()
    for spec, original in zip(_specs(), originals, strict=True):
        proxy = _raw(spec).__wrapped__
        assert isinstance(proxy, rmc.RRProxy)
        assert not proxy._self_rr_active
        _set(spec, original)


def test_out_of_range_version_raises_naming_it_unless_forced(
    cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = dataclasses.replace(rmc.megatron_line(), version=Version("0.20.1"))
    monkeypatch.setattr(_versions, "megatron_line", lambda: line)
    monkeypatch.setattr("rr_megatron_compat._install.megatron_line", lambda: line)
    with pytest.raises(rmc.UnsupportedMegatronError, match=r"0\.20\.1.*>=0\.12,<0\.20"):
        rmc.install()
    assert rmc.ADAPTER.installed_hooks() == ()
    rmc.install(force=True)
    try:
        assert rmc.ADAPTER.installed_hooks()
    finally:
        rmc.uninstall()


def test_the_module_function_of_earlier_releases_still_answers_with_a_warning(cpu: None) -> None:
    rmc.install()
    try:
        with pytest.warns(DeprecationWarning, match=r"ADAPTER\.installed_hooks\(\)"):
            assert rmc.installed_hooks() == rmc.ADAPTER.installed_hooks() != ()
    finally:
        rmc.uninstall()


def test_nomegatron_flags_per_line() -> None:
    assert not rmc.line_flags("0.12.3").score_function_topk
    assert rmc.line_flags("0.14.0").score_function_topk
    assert rmc.line_flags("0.16.1").native_replay
    assert rmc.line_flags("0.16.1").padding_mask
    assert not rmc.line_flags("0.15.3").native_replay
    assert not rmc.line_flags("0.15.3").padding_mask
    assert not rmc.line_flags("0.11.0").supported
    assert not rmc.line_flags("0.20.0").supported
    roles = {v: [s.role for s in rmc.hook_specs(rmc.line_flags(v))] for v in ("0.12", "0.16")}
    assert roles == {
        "0.12": ["routing", "topk_function", "group_select", "alltoall_preprocess"],
        "0.16": ["routing", "native_select", "alltoall_preprocess"],
    }
    assert [s.attribute for s in rmc.hook_specs(rmc.line_flags("0.14"))][1] == (
        "topk_routing_with_score_function"
    )


def test_nomegatron_routing_hook_reads_padding_mask_only_where_routing_takes_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rr_megatron_compat import _hooks

    mask = object()
    for version, expected in (("0.15.3", None), ("0.16.1", mask)):
        monkeypatch.setattr(_hooks, "megatron_line", lambda v=version: rmc.line_flags(v))
        assert _hooks._padding_mask(("logits", mask), {}) is expected
        assert _hooks._padding_mask(("logits",), {"padding_mask": mask}) is expected
        assert _hooks._padding_mask(("logits",), {}) is None


def test_nomegatron_hooks_find_arguments_by_name_as_a_bind_would() -> None:
    from rr_megatron_compat import _hooks

    def topk(scores: Any, topk: int, num_groups: Any = None, group_topk: Any = None) -> None:
        pass

    names = ("scores", "topk", "num_groups", "group_topk", "fused")  # no ``fused`` (0.12 - 0.13)
    assert _hooks._arguments(topk, ("s", 2), {"group_topk": 4}, *names) == ["s", 2, None, 4, None]
    assert _hooks._arguments(topk, (), {"topk": 2, "scores": "s"}, "scores", "topk") == ["s", 2]
    with pytest.raises(TypeError, match="'scores'"):
        _hooks._arguments(topk, (), {"topk": 2}, "scores")
    steered = _hooks._with_arguments(
        topk, ("s", 2, None), {"group_topk": None}, {"num_groups": 1, "group_topk": 1}
    )
    assert steered == (["s", 2, 1], {"group_topk": 1})
    assert _hooks._with_arguments(topk, ("s", 2), {}, {"num_groups": 1}) == (
        ["s", 2],
        {"num_groups": 1},
    )

    class Replay:
        def get_replay_topk(self, scores: Any, topk: int) -> None:
            pass

    before = len(_hooks._PARAMETERS)
    for _ in range(3):  # a bound method's parameters: one entry per class, not per instance
        assert _hooks._arguments(Replay().get_replay_topk, ("s",), {"topk": 2}, "scores") == ["s"]
    assert len(_hooks._PARAMETERS) == before + 1


def test_nomegatron_import_and_supported_need_no_torch() -> None:
    code = (
        "import sys, rr_megatron_compat as m, rr_megatron_compat._doctor as d; "
        "assert m.SUPPORTED == {'megatron-core': '>=0.12,<0.20'}; d.megatron_report(); "
        "bad = [n for n in ('torch', 'megatron') if n in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nomegatron_doctor_view_names_line_hooks_and_issues() -> None:
    from rr_megatron_compat._doctor import megatron_report, render

    report = megatron_report()
    text = render(report)
    assert "megatron-core" in text
    found = _versions.installed_version()
    if found is not None:
        assert str(found) in text
        assert "hooks install() uses" in text
        assert report["native_replay"] == (Version(found.base_version) >= Version("0.16"))


def test_C6_hook_targets_exist_on_this_line_and_no_module_imports_missing_names(cpu: None) -> None:
    """Every attribute install() wraps exists here, and importing the hooks pulls no
    moe_utils name that this line lacks (a grouped import failing as a whole on 0.12)."""
    for spec in _specs():
        assert callable(_raw(spec))
    for module in ("_hooks", "_install", "_attach", "_guards", "_config", "_stats", "_dispatcher"):
        importlib.import_module(f"rr_megatron_compat.{module}")
