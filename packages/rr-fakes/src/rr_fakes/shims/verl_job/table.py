"""The per-step table of a job run, read from verl's file logger (its own metrics, step by
step) and the workers' rr reports, and the checks that fail the session.

One verl step runs two engine passes on the actor: the old-log-prob pass (forward only) and the
update. Each pass's rr report says how many rows rr armed and how many the batch had to replay,
and per MoE layer the share of replayed rows whose native routing agreed with the engine's
(the rest are the (token, layer) pairs the trainer would have routed differently: with rr they
are routed as the engine did).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rr_fakes.shims.verl_job.job import JobRun
from rr_fakes.shims.verl_job.rr_hook import LOGP_GAP


class VerlJobCheckError(AssertionError):
    """A job's figures are not what the table says they must be."""


@dataclass(frozen=True)
class StepRow:
    job: str
    step: int
    rows_to_replay: int  # in the step's passes, summed
    rows_armed: int
    native_differ: int  # (token, MoE layer) pairs whose native routing differs from the engine's
    logp_gap: float  # mean |log p engine - log p trainer| over response tokens (old-log-prob)
    step_s: float
    rr_host_s: float
    rollout_bytes: int  # routes in the agent-loop worker's batch, on its way to the trainer
    trainer_bytes: int  # routes in the batches verl's trainer handed its actor worker


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pairs_differing(record: dict[str, Any]) -> int:
    rows = record["rows_armed"]
    return round(sum((1.0 - float(share)) * int(rows) for share in record["agreement"].values()))


def step_rows(run: JobRun) -> list[StepRow]:
    """One row per verl step; the workers' passes are assigned to steps in order (two per
    step: old log-prob, update)."""
    metrics = [m for m in read_jsonl(run.metrics) if "step" in m]
    events = read_jsonl(run.reports)
    passes = [r for r in events if r.get("event") == "pass"]
    per_step = len(passes) // max(len(metrics), 1)
    hops = {
        hop: _per_step([r["route_bytes"] for r in events if r.get("hop") == hop], len(metrics))
        for hop in ("rollout", "trainer")
    }
    rows = []
    for index, entry in enumerate(metrics):
        data = entry["data"]
        mine = passes[index * per_step : (index + 1) * per_step]
        rows.append(
            StepRow(
                job=run.spec.name,
                step=int(entry["step"]),
                rows_to_replay=sum(r["rows_to_replay"] for r in mine),
                rows_armed=sum(r["rows_armed"] for r in mine),
                native_differ=sum(_pairs_differing(r) for r in mine),
                logp_gap=float(data.get(LOGP_GAP, float("nan"))),
                step_s=float(data.get("timing_s/step", float("nan"))),
                rr_host_s=sum(r["rr_host_s"] for r in mine),
                rollout_bytes=hops["rollout"][index],
                trainer_bytes=hops["trainer"][index],
            )
        )
    return rows


def _per_step(values: list[int], steps: int) -> list[int]:
    """Each step's sum of a run of per-call figures that come in the same number a step."""
    size = len(values) // max(steps, 1)
    return [sum(values[i * size : (i + 1) * size]) for i in range(steps)]


def check(run: JobRun, rows: list[StepRow]) -> list[str]:
    """What is wrong with a finished job (empty when nothing is)."""
    problems = []
    if run.returncode != 0:
        problems.append(f"{run.spec.name}: exit {run.returncode} (log: {run.log})")
    if len(rows) != run.spec.steps:
        problems.append(f"{run.spec.name}: {len(rows)} steps logged, expected {run.spec.steps}")
    events = read_jsonl(run.reports)
    if run.spec.rr:
        sides = {r["side"] for r in events if r.get("event") == "installed"}
        if not {"rollout", "rollout-arrival", run.spec.engine.rstrip("2")} <= sides:
            problems.append(f"{run.spec.name}: rr sides installed {sorted(sides)}")
    for row in rows:
        if run.spec.rr and (row.rows_armed != row.rows_to_replay or row.rows_armed == 0):
            problems.append(
                f"{row.job} step {row.step}: rr armed {row.rows_armed} rows, the batch has "
                f"{row.rows_to_replay} to replay"
            )
        if not run.spec.rr and row.rows_armed:
            problems.append(f"{row.job} step {row.step}: {row.rows_armed} rows armed without rr")
    return problems


def markdown(rows: list[StepRow], runs: list[JobRun]) -> str:
    """The table (per job, per step) and each job's wall time and peak memory."""
    lines = [
        "| job | step | rows to replay | rows rr replayed | pairs natively off the engine "
        "| mean abs d log p | step s | rr host ms (share) | route bytes rollout -> trainer "
        "| route bytes trainer -> actor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        differ = r.native_differ if r.job.endswith("-rr") else "-"  # measured where rr replays
        share = r.rr_host_s / r.step_s if r.step_s else float("nan")
        lines.append(
            f"| {r.job} | {r.step} | {r.rows_to_replay} | {r.rows_armed} | {differ} "
            f"| {r.logp_gap:.2e} | {r.step_s:.1f} | {r.rr_host_s * 1e3:.1f} ({share:.2%}) "
            f"| {r.rollout_bytes:,} | {r.trainer_bytes:,} |"
        )
    lines += ["", "| job | exit | wall s | peak MiB (process tree) |", "|---|---|---|---|"]
    for run in runs:
        lines.append(
            f"| {run.spec.name} | {run.returncode} | {run.wall_s:.0f} | {run.peak_rss_mib:.0f} |"
        )
    return "\n".join(lines)


def compare(rows: list[StepRow]) -> list[str]:
    """The rr-off / rr-on differences the table promises: the job with rr replays rows its
    trainer would have routed otherwise than the engine (the pairs the job without rr trains on
    natively), so replay changed routing; and its routes cross Ray in fewer bytes a replayed
    row, on each hop, than verl's own (where both jobs ran). The gap in log p is reported, not
    checked (the trainer's bfloat16 autocast dominates it)."""
    problems = []
    for job in sorted({r.job for r in rows if r.job.endswith("-rr")}):
        mine = [r for r in rows if r.job == job]
        if not sum(r.native_differ for r in mine):
            problems.append(
                f"{job}: no replayed (token, layer) pair routes natively otherwise than the "
                "engine: the job shows no difference for rr to make"
            )
        theirs = [r for r in rows if r.job == job.removesuffix("-rr") + "-verl"]
        for hop in ("rollout_bytes", "trainer_bytes") if theirs else ():
            ours_per_row, verls_per_row = _per_row(mine, hop), _per_row(theirs, hop)
            if not ours_per_row < verls_per_row:
                problems.append(
                    f"{job}: {hop} {ours_per_row:.1f} a replayed row; verl's own job "
                    f"{verls_per_row:.1f}: rr's routes must cross Ray in fewer bytes"
                )
    return problems


def _per_row(rows: list[StepRow], hop: str) -> float:
    replayed = sum(r.rows_to_replay for r in rows)
    return sum(getattr(r, hop) for r in rows) / replayed if replayed else float("nan")
