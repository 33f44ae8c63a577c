"""Every version fact of rr-npu, as plain data with no imports: ``rr doctor`` reads ``SUPPORTED``
(entry point ``rr.supported``). The megatron-core lines its tests run on (those MindSpeed has
branches for) are the harness's pins (``NPU_MEGATRON_LINES`` in ``rr_fakes/pins.py``)."""

SUPPORTED: dict[str, str] = {"torch-npu": ">=2.13,<2.15"}
