"""NPU determinism settings.

Real-world failure guarded against: replay runs that are exact in routing but still drift
because HCCL reductions and matmul K-splitting were left non-deterministic, with nobody able to
tell which variables a helper actually changed.
"""

from __future__ import annotations

import pytest
import torch

import rr_npu


def test_sets_reports_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in rr_npu.NPU_DETERMINISM_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOSE_MATMUL_K_SHIFT", "1")
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    report = rr_npu.set_npu_determinism()
    try:
        import os

        assert os.environ["HCCL_DETERMINISTIC"] == "true"
        assert os.environ["LCCL_DETERMINISTIC"] == "1"
        assert os.environ["ATB_MATMUL_SHUFFLE_K_ENABLE"] == "0"
        assert report.env["HCCL_DETERMINISTIC"] == (None, "true")
        assert report.kept == ("CLOSE_MATMUL_K_SHIFT",)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert report.changed
        assert "HCCL_DETERMINISTIC: None -> 'true'" in report.describe()
    finally:
        report.restore()
    import os

    assert "HCCL_DETERMINISTIC" not in os.environ
    assert os.environ["CLOSE_MATMUL_K_SHIFT"] == "1"
    assert (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ) == before
