"""Every version fact of rr-npu, as plain data with no imports: ``rr doctor`` reads ``SUPPORTED``
(entry point ``rr.supported``) and the noxfile loads this file by path (one npu session per line
in ``MEGATRON_LINES``, so nox never imports torch)."""

SUPPORTED: dict[str, str] = {"torch-npu": ">=2.13,<2.15"}

#: The megatron-core lines MindSpeed has branches for (26.1.0_core_r0.12.1, core_r0.16.0,
#: core_r0.17.0, core_r0.18.0), which the npu session tests rr-npu on under the emulation of that
#: branch (each line's pinned release and pip flags are rr-megatron-compat's ``MEGATRON_LINES``).
MEGATRON_LINES: tuple[str, ...] = ("0.12", "0.16", "0.17", "0.18")
