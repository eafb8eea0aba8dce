"""A plot per trace: for each model/accelerator pair, the arrival rate with every strategy's serving replicas, and
every strategy's per-window attainment, over both passes. Each strategy is drawn at its best variant, with the
oracle's engine config (slotune with its own); the hindsight pool's replicas (a yardstick, `hindsight`) dashed, the
same both days."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from slotune.tracebench.attainment import request_meets
from slotune.tracebench.run import CaseResult, best_variants

COLORS = {"slotune": "tab:red", "static-peak": "tab:gray", "queue-autoscaler": "tab:blue",
          "saturation-autoscaler": "tab:green", "predictive-planner": "tab:purple"}


def plot_trace(results: list[CaseResult], path: Path) -> None:
    figure, axes = plt.subplots(2 * len(results), 1, figsize=(11, 4.2 * len(results)), sharex=False, squeeze=False)
    for i, result in enumerate(results):
        _plot_case(result, axes[2 * i][0], axes[2 * i + 1][0])
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _plot_case(result: CaseResult, replicas_axis: plt.Axes, attainment_axis: plt.Axes) -> None:
    best = best_variants(result.figures)
    window_s = result.case.window_s
    shown = [r for r in result.runs if (r.strategy, r.engine_config, r.variant) in best
             and r.engine_config in ("oracle", "tuned")]
    rate_axis = replicas_axis.twinx()
    first = shown[0]
    minutes = [w.end_s / 60 for w in first.windows]
    rate_axis.fill_between(minutes, [w.arrival_rate_per_s for w in first.windows], color="0.85", step="pre")
    rate_axis.set_ylabel("arrivals/s")
    replicas_axis.set_zorder(rate_axis.get_zorder() + 1)
    replicas_axis.patch.set_visible(False)
    for run in shown:
        label = f"{run.strategy} ({run.engine_config}{', ' + run.variant if run.variant else ''})"
        replicas_axis.step([w.end_s / 60 for w in run.windows], [w.num_ready for w in run.windows],
                           color=COLORS[run.strategy], label=label, where="pre")
        met: dict[int, list[bool]] = {}
        for record in run.finished:
            met.setdefault(int(record.arrival_s // window_s), []).append(request_meets(result.case.load.slo,
                                                                                        record))
        keys = sorted(met)
        attainment_axis.plot([(k + 1) * window_s / 60 for k in keys], [sum(met[k]) / len(met[k]) for k in keys],
                             color=COLORS[run.strategy], lw=1)
    _plot_hindsight(result, replicas_axis)
    for axis in (replicas_axis, attainment_axis):
        axis.axvline(result.planned.duration_s / 60, color="k", ls=":", lw=0.8)
    title = f"{result.case.trace.name}: {result.case.model} on {result.case.accelerator}"
    replicas_axis.set_title(f"{title} (start-up {result.case.startup_s:.0f} s)")
    replicas_axis.set_ylabel("serving replicas")
    replicas_axis.legend(fontsize=7, loc="upper left")
    attainment_axis.set_ylabel("requests meeting SLO")
    attainment_axis.set_xlabel("minutes (dotted: second pass begins)")
    attainment_axis.set_ylim(0, 1.02)


def _plot_hindsight(result: CaseResult, axis: plt.Axes) -> None:
    """The oracle config's hindsight pool, where it reached its bar, over both passes."""
    pool = result.hindsight.get("oracle")
    if pool is None or not pool.reached or not pool.replicas:
        return
    window_min, pass_min = result.case.window_s / 60, result.planned.duration_s / 60
    minutes = [day * pass_min + (k + 1) * window_min for day in (0, 1) for k in range(len(pool.replicas))]
    axis.step(minutes, [*pool.replicas, *pool.replicas], color="k", ls="--", lw=0.8, where="pre",
              label=f"hindsight pool (oracle; a yardstick, {pool.per_replica_per_s:.2f} req/s a replica)")
