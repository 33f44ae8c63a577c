"""Public names of earlier releases, kept for one release with a DeprecationWarning naming what
replaces them: the fused-gating guard is part of :func:`rr_npu.install` and
:func:`rr_npu.uninstall` (which put it in and take it out with the rest of rr's hooks)."""

from __future__ import annotations

import warnings

from rr_npu import _gating


def install_gating_guard() -> bool:
    """Deprecated: :func:`rr_npu.install` installs the guard where torch_npu is loaded."""
    warnings.warn(
        "rr_npu.install_gating_guard() is deprecated: rr_npu.install() installs the fused-gating "
        "guard with rr's other hooks",
        DeprecationWarning,
        stacklevel=2,
    )
    return _gating.install_gating_guard()


def uninstall_gating_guard() -> int:
    """Deprecated: :func:`rr_npu.uninstall` takes the guard out with rr's other hooks."""
    warnings.warn(
        "rr_npu.uninstall_gating_guard() is deprecated: rr_npu.uninstall() takes the "
        "fused-gating guard out with rr's other hooks",
        DeprecationWarning,
        stacklevel=2,
    )
    return _gating.uninstall_gating_guard()
