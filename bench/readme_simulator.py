"""The README's figures for the simulator's validation against the real runtime: configurations and percentiles
within tolerance, and the largest miss."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.readme_format import Result, pct, row

# validate_simulator.py's target (a goal, not a measurement): a percentile within 25% of the measured one.
SIMULATOR_TOLERANCE = 0.25


@dataclass(frozen=True)
class SimulatorCounts:
    """The validation's headline: configurations and single percentiles within tolerance."""

    num_within: int
    num_cases: int
    num_close: int
    num_percentiles: int
    median_error: float

    def describe(self, bold: bool = False) -> str:
        head = f"{self.num_within} of {self.num_cases}"
        return (f"{f'**{head}**' if bold else head} configurations within {pct(SIMULATOR_TOLERANCE)} on all four "
                f"percentiles ({self.num_close} of {self.num_percentiles} percentiles), median error "
                f"{pct(self.median_error)}")


def _signed_errors(case: Result) -> list[tuple[str, float]]:
    """(percentile, predicted / measured - 1) for every percentile the simulator predicted."""
    keys = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
    return [(key.replace("_", " ").upper(), case[key]["predicted_ms"] / case[key]["measured_ms"] - 1)
            for key in keys if case[key]["predicted_ms"] is not None]


def simulator_counts(validation: Result) -> SimulatorCounts:
    cases = validation["cases"]
    errors = [[abs(e) for _, e in _signed_errors(c)] for c in cases]
    flat = [e for case in errors for e in case]
    return SimulatorCounts(num_within=sum(1 for e in errors if len(e) == 4 and max(e) <= SIMULATOR_TOLERANCE),
                           num_cases=len(cases), num_close=sum(1 for e in flat if e <= SIMULATOR_TOLERANCE),
                           num_percentiles=len(flat), median_error=statistics.median(flat))


def simulator_worst(validation: Result) -> str:
    case, (name, error) = max(((c, e) for c in validation["cases"] for e in _signed_errors(c)),
                              key=lambda pair: abs(pair[1][1]))
    return f"{case['case']} {name}, {abs(error):.0%} {'low' if error < 0 else 'high'}"


def simulator_row(validation: Result) -> str:
    cases = validation["cases"]
    runs = sorted({len(c["ttft_p50"]["measured_runs_ms"]) for c in cases})
    return row(f"simulator vs real runtime (tiny, CPU), P50/P99 TTFT/TPOT on {len(cases)} configs, "
                f"{'-'.join(map(str, runs))} runs each",
                f"{simulator_counts(validation).describe(bold=True)}; largest miss: {simulator_worst(validation)}",
                "simulator_validation.md")
