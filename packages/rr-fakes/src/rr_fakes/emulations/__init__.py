"""Emulations, built from the real project's source, of what cannot run on this CPU machine:
rollout engines' answers in every era and wire form (``engines``), MindSpeed's patch registry,
adaptor and MoE features (``mindspeed``) and torch_npu's device, HCCL dtype table and gating
kernel (``torch_npu``). None of them is the real package; what does run here is in
:mod:`rr_fakes.shims`."""
