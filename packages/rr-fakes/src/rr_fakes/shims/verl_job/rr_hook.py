"""rr in verl's Ray workers, and the harness's per-pass report of what rr did there.

:func:`install` is the job's ``worker_process_setup_hook``: Ray runs it in every worker process
verl starts (task runner, actor worker group, vLLM server, agent-loop workers, ...). It runs
the one line a verl user writes, ``rr_megatron_compat.verl.install()``, which imports no verl
module: each rr side is switched on when verl imports the module it hooks (a post-import hook),
so a worker that never imports a side pays nothing for it.

Per engine pass (verl's ``forward_backward_batch``: the old-log-prob pass and the update), the
worker appends one JSON line to ``$RR_VERL_JOB_REPORTS`` from rr's own step report: the rows rr
armed, the rows the batch has to replay (every token of a sequence with a response but its last,
the rows the rollout engine ran), the share of replayed rows per MoE layer whose native routing
agreed with the engine's, and rr's host time (arming and the step's end) beside the pass's.

``RR_VERL_JOB_DISARM_LAYER=<n>`` switches layer ``n``'s router back to native routing after each
arming, in the worker: a replay broken in one layer, which rr's step end must refuse.
"""

from __future__ import annotations

import inspect
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

import wrapt

FSDP_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
ENGINE_WORKERS = "verl.workers.engine_workers"
MEGATRON_ENGINE = "verl.workers.engine.megatron.transformer_impl"
#: rr's verl Megatron side's per-chunk state (its controller).
MEGATRON_CHUNK = "rr_megatron_compat.verl._chunk"
#: The rollout side's module (the switch installs that side when a process imports it).
ROLLOUT_MODULE = "verl.experimental.agent_loop.agent_loop"
#: What verl's training worker is handed across Ray (the harness weighs the routes in it).
RECEIVED = ("infer_batch", "train_mini_batch")
DISARM = "RR_VERL_JOB_DISARM_LAYER"
REPORTS = "RR_VERL_JOB_REPORTS"
DEBUG_METRICS = "verl.utils.debug.metrics"
LOGP_GAP = "rr_harness/logp_abs_diff_mean"


class _Tally:
    """What one controller armed this pass, and rr's host seconds."""

    def __init__(self) -> None:
        self.rows = 0
        self.rr_s = 0.0


_TALLIES: weakref.WeakKeyDictionary[Any, _Tally] = weakref.WeakKeyDictionary()


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(REPORTS)
    if path:
        line = json.dumps({"pid": os.getpid(), **record}) + "\n"
        with Path(path).open("a") as out:  # one short append per pass: whole lines
            out.write(line)


def _armed_rows(method: str, args: Any, kwargs: Any) -> int:
    """The rows one arming call marks for replay (``arm_batch``: the batch's valid rows;
    ``arm``: the replay mask's rows, else every router row)."""
    if method == "arm_batch":
        batch = args[1] if len(args) > 1 else kwargs["batch"]
        return int(batch.valid_N.sum())
    mask = kwargs.get("replay_mask_T")
    if mask is not None:
        return int(mask.sum())
    rows = kwargs.get("rows_T")
    routes = args[1] if len(args) > 1 else kwargs["routes_TLK"]
    return int(rows.shape[0] if rows is not None else routes.shape[0])


def _arming(method: str) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        start = time.perf_counter()
        result = wrapped(*args, **kwargs)
        tally = _TALLIES.setdefault(instance, _Tally())
        tally.rows += _armed_rows(method, args, kwargs)
        tally.rr_s += time.perf_counter() - start
        layer = os.environ.get(DISARM)
        if layer:
            instance.set_mode("off", layers=[int(layer)])  # the broken worker the session catches
        return result

    return wrapper


#: The step reports of the Megatron engine pass in progress (controller, report), else None:
#: verl's Megatron engine ends rr's step inside its pass (``RouterReplay.clear_global_indices``).
_PASS_REPORTS: list[tuple[Any, Any]] | None = None


def _end_step(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    start = time.perf_counter()
    try:
        report = wrapped(*args, **kwargs)
    finally:
        _TALLIES.setdefault(instance, _Tally()).rr_s += time.perf_counter() - start
    if _PASS_REPORTS is not None:
        _PASS_REPORTS.append((instance, report))
    return report


def _rows_to_replay(data: Any) -> int:
    """Every token of a sequence with a response but its last: the rows the rollout engine
    ran, which verl's R3 replays (the batch is verl's no-padding one: jagged tensors)."""
    lengths = data["input_ids"].offsets().diff().tolist()
    responses = [int(r.sum()) for r in data["response_mask"].unbind()]
    return sum(n - 1 for n, r in zip(lengths, responses, strict=True) if r)


def _forward_backward_batch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    import rr_transformers.verl as rr_verl

    data = args[0] if args else kwargs["data"]
    forward_only = bool(args[2] if len(args) > 2 else kwargs.get("forward_only", False))
    start = time.perf_counter()
    output = wrapped(*args, **kwargs)
    seconds = time.perf_counter() - start
    report = rr_verl.last_report(instance.module)
    controller = rr_verl.controller_of(instance.module)
    tally = _TALLIES.pop(controller, _Tally()) if controller is not None else _Tally()
    _write_pass(
        instance,
        data,
        forward_only=forward_only,
        pass_s=seconds,
        rows_armed=tally.rows,
        rr_host_s=tally.rr_s,
        agreement={} if report is None else report.agreement,
        order_agreement={} if report is None else report.order_agreement,
    )
    return output


def _write_pass(instance: Any, data: Any, **figures: Any) -> None:
    """One engine pass's report line: the figures given, beside what the batch had to replay."""
    has_routes = data.get("routed_experts", None) is not None
    _write(
        {
            "event": "pass",
            "engine": type(instance).__name__,
            "routes_in_batch": has_routes,
            "rows_to_replay": _rows_to_replay(data) if has_routes else 0,
            **figures,
        }
    )


def _megatron_forward_backward_batch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """The Megatron engine's pass: rr's step reports of its model chunks, ended in the pass.
    Each chunk's controller arms the batch's rows for its own layers: the rows are one chunk's,
    the agreement every chunk's layers."""
    global _PASS_REPORTS
    data = args[0] if args else kwargs["data"]
    forward_only = bool(args[2] if len(args) > 2 else kwargs.get("forward_only", False))
    reports: list[tuple[Any, Any]] = []
    _PASS_REPORTS = reports
    start = time.perf_counter()
    try:
        output = wrapped(*args, **kwargs)
    finally:
        _PASS_REPORTS = None
    seconds = time.perf_counter() - start
    tallies = [_TALLIES.pop(controller, _Tally()) for controller, _ in reports]
    agreement: dict[int, float] = {}
    order_agreement: dict[int, float] = {}
    for _, report in reports:
        agreement.update(report.agreement)
        order_agreement.update(report.order_agreement)
    _write_pass(
        instance,
        data,
        forward_only=forward_only,
        pass_s=seconds,
        rows_armed=max((tally.rows for tally in tallies), default=0),
        rr_host_s=sum(tally.rr_s for tally in tallies),
        agreement=agreement,
        order_agreement=order_agreement,
    )
    return output


def _measured_chunks(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """rr's verl Megatron side makes each chunk's controller without agreement (verl's API has
    no place to read it); the harness measures it, as rr's FSDP side does."""
    wrapped(*args, **kwargs)
    instance.controller.measure_agreement = True


def _debug_metrics(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """verl's rollout-vs-actor metrics plus the mean |log p| gap over response tokens."""
    metrics = wrapped(*args, **kwargs)
    batch = (args[0] if args else kwargs["data"]).batch
    mask = batch["response_mask"].bool()
    gap = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[mask]
    metrics[LOGP_GAP] = float(gap.mean()) if gap.numel() else float("nan")
    return metrics


def route_bytes(tensors: Any, objects: Any) -> int:
    """The bytes of a batch's routes as Ray pickles them: verl's ``routed_experts`` tensor (its
    values: a jagged tensor's offsets are the batch's own) and rr's compact per-sample payloads
    (``rr_routes``)."""
    import pickle

    total = 0
    routes = tensors.get("routed_experts", None) if tensors is not None else None
    if routes is not None:
        total += (routes.values() if routes.is_nested else routes).nbytes
    compact = objects.get("rr_routes", None) if objects is not None else None
    if compact is not None:
        items = compact.tolist() if hasattr(compact, "tolist") else compact
        total += len(pickle.dumps(list(items), protocol=5))
    return total


def _rollout_received(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """The agent-loop workers' batches as verl's trainer receives them (joined), weighed in
    the trainer: a wrapper on the worker's own class would not reach the worker processes (Ray
    ships an actor class with copies of its methods, see ``rr_vllm.verl.compacting_worker``)."""

    def weigh(out: Any) -> Any:
        bytes_ = route_bytes(out.batch, out.non_tensor_batch)
        _write({"event": "sent", "hop": "rollout", "route_bytes": bytes_})
        return out

    result = wrapped(*args, **kwargs)
    if inspect.isawaitable(result):  # verl's auto_await: a coroutine inside an event loop

        async def weighed() -> Any:
            return weigh(await result)

        return weighed()
    return weigh(result)


def _received(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """The batch verl's training worker was handed, as it arrived (before rr expands it)."""
    data = args[0] if args else kwargs["data"]
    _write({"event": "sent", "hop": "trainer", "route_bytes": route_bytes(data, data)})
    return wrapped(*args, **kwargs)


def _measured_rollout(module: Any) -> None:
    wrapt.wrap_function_wrapper(module, "AgentLoopManager.generate_sequences", _rollout_received)


def _measured_worker(module: Any) -> None:
    for entry in RECEIVED:
        wrapt.wrap_function_wrapper(module, f"TrainingWorker.{entry}", _received)


_CONTROLLERS_MEASURED = False


def _measure_controllers() -> None:
    """rr's arming and step ends, once a process (verl's engine package imports both engines)."""
    global _CONTROLLERS_MEASURED
    if _CONTROLLERS_MEASURED:
        return
    import rr_core

    _CONTROLLERS_MEASURED = True
    for method in ("arm", "arm_batch"):
        wrapt.wrap_function_wrapper(rr_core.ReplayController, method, _arming(method))
    wrapt.wrap_function_wrapper(rr_core.ReplayController, "end_step", _end_step)


def _measured_engine(module: Any) -> None:
    wrapt.wrap_function_wrapper(
        module, "FSDPEngine.forward_backward_batch", _forward_backward_batch
    )
    _measure_controllers()


def _measured_megatron_engine(module: Any) -> None:
    wrapt.wrap_function_wrapper(
        module, "MegatronEngine.forward_backward_batch", _megatron_forward_backward_batch
    )
    _measure_controllers()


def _measured_chunk(module: Any) -> None:
    wrapt.wrap_function_wrapper(module, "_Chunk.__init__", _measured_chunks)


def _measured_trainer(module: Any) -> None:
    wrapt.wrap_function_wrapper(module, "calculate_debug_metrics", _debug_metrics)


def _reported(side: str) -> Any:
    """A post-import hook writing that ``side`` is in place (after the switch's own hook)."""

    def report(module: Any) -> None:
        import rr_megatron_compat.verl as switch

        found = switch.sides().get(side)
        if found is not None and found.installer.is_installed():
            _write({"event": "installed", "side": side})

    return report


def measure() -> None:
    """The harness's figures alone (the job without rr): Ray's ``worker_process_setup_hook``."""
    wrapt.register_post_import_hook(_measured_trainer, DEBUG_METRICS)
    wrapt.register_post_import_hook(_measured_engine, FSDP_ENGINE)
    wrapt.register_post_import_hook(_measured_megatron_engine, MEGATRON_ENGINE)
    wrapt.register_post_import_hook(_measured_chunk, MEGATRON_CHUNK)
    wrapt.register_post_import_hook(_measured_rollout, ROLLOUT_MODULE)
    wrapt.register_post_import_hook(_measured_worker, ENGINE_WORKERS)
    _write({"event": "hook"})


def install() -> None:
    """Ray's ``worker_process_setup_hook``: the one line a verl user writes
    (``rr_megatron_compat.verl.install``, each rr side switched on when verl imports its module),
    then the harness's reports of which sides came up and its figures (the engine's report
    wrapper outside rr's)."""
    import rr_megatron_compat.verl as switch

    switch.install()
    sides = {"fsdp": FSDP_ENGINE, "megatron": MEGATRON_ENGINE, "rollout": ROLLOUT_MODULE}
    sides["rollout-arrival"] = ENGINE_WORKERS
    for side, module in sides.items():
        wrapt.register_post_import_hook(_reported(side), module)
    measure()
