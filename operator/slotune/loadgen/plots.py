"""PNG of the client-side latency CDFs (TTFT, TPOT, ITL, E2E), with SLO targets drawn where given."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt
import numpy as np

from slotune.loadgen.record import RequestRecord
from slotune.loadgen.stats import CLIENT_METRICS, request_latencies_ms
from slotune.slo import SLOSpec


def plot_latency_cdfs(records: Sequence[RequestRecord], path: Path, slo: SLOSpec | None = None,
                      title: str = "latency CDFs") -> Path:
    figure, axes = plt.subplots(1, len(CLIENT_METRICS), figsize=(4 * len(CLIENT_METRICS), 3.4))
    targets = slo.targets() if slo else []
    for axis, (key, metric) in zip(axes, CLIENT_METRICS.items(), strict=True):
        values = np.sort(np.asarray(request_latencies_ms([r for r in records if not r.warmup], metric)))
        if values.size:
            axis.plot(values, np.arange(1, values.size + 1) / values.size, drawstyle="steps-post")
        for target in (t for t in targets if t.metric == metric):
            axis.axvline(target.target_ms, color="red", linestyle="--", linewidth=1)
            axis.annotate(f"p{target.percentile} target", (target.target_ms, 0.05), rotation=90, fontsize=7)
        axis.set_xlabel(f"{key} (ms)")
        axis.set_ylim(0, 1.01)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests (ITL: of token gaps)")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
