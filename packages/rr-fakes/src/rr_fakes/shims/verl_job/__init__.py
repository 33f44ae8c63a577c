"""Real verl run under shims: verl 0.9.1's own ``python -m verl.trainer.main_ppo`` on this CPU
machine, with and without rr: verl's platform plugin and the patches the job needs (each guarded by
the release it was checked on), the checkpoint and data it reads, the Ray hook that switches rr on
in verl's workers and reports what rr did, and the per-step table (``python -m
rr_fakes.shims.verl_job``, the ``verl_job`` nox session). Importing this package imports nothing
heavy."""
