"""Every version fact of rr-npu, as plain data with no imports: ``rr doctor`` reads ``SUPPORTED``
(entry point ``rr.supported``) and the noxfile loads this file by path (the rr-npu tests run in
the megatron session of each line in ``MEGATRON_LINES``; nox never imports torch)."""

SUPPORTED: dict[str, str] = {"torch-npu": ">=2.13,<2.15"}

#: The megatron-core lines MindSpeed has branches for (26.1.0_core_r0.12.1, core_r0.16.0,
#: core_r0.17.0, core_r0.18.0), on which the megatron sessions test rr-npu under the emulation
#: of that branch (each line's pinned release and pip flags: rr_fakes.pins ``MEGATRON_LINES``).
MEGATRON_LINES: tuple[str, ...] = ("0.12", "0.16", "0.17", "0.18")
