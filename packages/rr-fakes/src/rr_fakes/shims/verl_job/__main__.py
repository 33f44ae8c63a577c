"""``python -m rr_fakes.shims.verl_job``: verl's own job on this CPU machine, one job at a time,
the per-step table printed (and written with ``--out``); exit 1 if a check fails.

``--jobs fsdp2-verl,fsdp2-rr`` picks jobs; ``--disarm-layer N`` breaks rr's replay of layer N
in the workers of every rr job (the session must then fail).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from rr_fakes.shims.verl_job import assets, job, table

#: The jobs the harness knows; the session runs :data:`DEFAULT_JOBS` (the Megatron engine's
#: two jobs run with ``--jobs megatron-verl,megatron-rr``: see the package README).
JOBS = {
    spec.name: spec
    for spec in (
        job.JobSpec(engine="fsdp2", rr=False),
        job.JobSpec(engine="fsdp2", rr=True),
        job.JobSpec(engine="megatron", rr=False),
        job.JobSpec(engine="megatron", rr=True),
    )
}
DEFAULT_JOBS = "fsdp2-verl,fsdp2-rr"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rr_fakes.shims.verl_job")
    parser.add_argument("--jobs", default=DEFAULT_JOBS, help="comma-separated job names")
    parser.add_argument("--family", default="qwen3_moe")
    parser.add_argument("--work", type=Path, default=None, help="folder for logs and files")
    parser.add_argument("--out", type=Path, default=None, help="write the table here")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--disarm-layer", type=int, default=None)
    args = parser.parse_args(argv)
    unknown = set(args.jobs.split(",")) - set(JOBS)
    if unknown:
        parser.error(f"unknown jobs {sorted(unknown)}; known: {', '.join(JOBS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="rr-verl-job-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.disarm_layer is not None:
        os.environ["RR_VERL_JOB_DISARM_LAYER"] = str(args.disarm_layer)
    checkpoints = {
        engine: assets.chat_checkpoint(
            args.family, work, **(assets.MEGATRON_OVERRIDES.get(args.family, {}) if mega else {})
        )
        for engine, mega in (("fsdp2", False), ("megatron", True))
        if any(JOBS[name].engine == engine for name in args.jobs.split(","))
    }
    train, val = assets.dataset(work / "data")
    reward = assets.reward_file(work)
    runs, rows, problems = [], [], []
    for name in args.jobs.split(","):
        print(f"== {name}", flush=True)
        model = checkpoints[JOBS[name].engine].path
        run = job.run(JOBS[name], model, train, val, reward, work, args.timeout)
        if job.ray_start_failed(run):  # the machine's load, not the job: once more
            print(f"   Ray's node did not start in time ({run.wall_s:.0f} s); again", flush=True)
            run = job.run(JOBS[name], model, train, val, reward, work, args.timeout)
        runs.append(run)
        mine = table.step_rows(run)
        rows += mine
        problems += table.check(run, mine)
        print(
            f"   exit {run.returncode}, {run.wall_s:.0f} s, peak {run.peak_rss_mib:.0f} MiB",
            flush=True,
        )
    problems += table.compare(rows)
    text = table.markdown(rows, runs)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
