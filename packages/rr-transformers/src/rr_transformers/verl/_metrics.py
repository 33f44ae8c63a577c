"""rr's figures of one verl engine pass, under the ``rr/`` keys verl logs.

verl's engine returns ``{"model_output", "loss", "metrics"}`` from ``forward_backward_batch``;
its training worker gathers ``metrics`` over the data-parallel ranks and the update's
mini-batches, and its trainer logs their mean with the step's other metrics. rr adds one value
per pass of each key, as a one-element list: verl's own metrics are lists (one value per
micro-batch) and its worker flattens what it gathers over the data-parallel ranks with
``itertools.chain``, which a bare float breaks. A verl user's logger shows, per step (averaged
over passes and ranks):

- ``rr/replayed_rows``: rows armed with routes and replayed (0 in an R2 recording pass);
- ``rr/routed_differently``: (token, MoE layer) pairs whose own (native) routing differs from
  the replayed one, from the agreement rr measures on every replayed row;
- ``rr/agreement`` / ``rr/order_agreement``: the replayed rows' share whose native set equals
  the replayed set (and is in the router's score order), mean over the MoE layers;
- ``rr/seconds``: time in rr's own code during the pass (arming, recording, the step's end).
"""

from __future__ import annotations

from rr_core import StepReport

PREFIX = "rr/"


def pass_metrics(
    report: StepReport, *, replayed_rows: int, seconds: float
) -> dict[str, list[float]]:
    """The ``rr/`` metrics of a pass that replayed ``replayed_rows`` rows (per MoE layer)."""
    layers = list(report.agreement)
    figures = {"replayed_rows": float(replayed_rows), "seconds": seconds}
    if layers:
        differ = sum(round((1.0 - report.agreement[n]) * replayed_rows) for n in layers)
        figures["routed_differently"] = float(differ)
        figures["agreement"] = sum(report.agreement.values()) / len(layers)
        order = report.order_agreement
        figures["order_agreement"] = sum(order.get(n, 0.0) for n in layers) / len(layers)
    return {PREFIX + name: [value] for name, value in figures.items()}
