"""Refit the roofline's efficiencies and fixed costs from measured step times, by least squares.

The step model is t = fixed + max(memory_s / bandwidth_eff, compute_s / compute_eff) (see `roofline`). For a given
assignment of each measured step to its bound regime that is linear in (fixed, 1/bandwidth_eff, 1/compute_eff), so
we alternate: assign regimes with the current fit, solve the non-negative least-squares problem (scipy's NNLS,
Lawson & Hanson 1974), repeat until the assignment stops changing. That start is then polished by bounded nonlinear
least squares on the max() model itself (efficiencies in (0, 1], overhead >= 0), minimising relative errors.
Measurements come from the runtime's own step timings (the iteration histogram and per-step logs) or from a benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares, nnls

from slotune.perfmodel.roofline import Efficiency, StepShape, StepTimeModel

MAX_ROUNDS = 10
IDENTIFIABLE_SPREAD = 2.0  # bytes read must vary this much across steps to separate bandwidth from fixed cost


@dataclass(frozen=True)
class StepMeasurement:
    shape: StepShape
    step_time_s: float


@dataclass(frozen=True)
class CalibrationResult:
    efficiency: Efficiency
    rms_relative_error: float  # root mean square of (predicted - measured) / measured after the fit
    num_measurements: int


def calibrate(model: StepTimeModel, measurements: Sequence[StepMeasurement]) -> CalibrationResult:
    """Fit the fixed per-step cost and both efficiencies of `model` to measured steps."""
    if len(measurements) < 3:
        raise ValueError(f"need at least 3 step measurements to fit 3 terms, got {len(measurements)}")
    costs = [model.cost(m.shape) for m in measurements]
    memory = np.array([c.memory_s for c in costs])
    compute = np.array([c.compute_s for c in costs])
    measured = np.array([m.step_time_s for m in measurements]) - np.array([c.comm_s for c in costs])
    eff = model.eff
    memory_bound = memory / eff.bandwidth >= compute / eff.compute
    for _ in range(MAX_ROUNDS):
        fitted = _solve(memory, compute, measured, memory_bound, eff)
        new_bound = memory / fitted.bandwidth >= compute / fitted.compute
        eff = fitted
        if np.array_equal(new_bound, memory_bound):
            break
        memory_bound = new_bound
    if memory.max() < IDENTIFIABLE_SPREAD * memory.min():
        # Every step read about the same bytes (one model's weights): a fixed cost and 1/bandwidth are then
        # collinear, so bandwidth stays at the prior and the fit explains the rest with the fixed cost.
        eff = replace(eff, bandwidth=model.eff.bandwidth)
        eff = _polish(memory, compute, measured, eff, hold_bandwidth=True)
    else:
        eff = _polish(memory, compute, measured, eff)
    fitted_model = replace(model, efficiency=eff)
    predicted = np.array([fitted_model.step_time_s(m.shape) for m in measurements])
    actual = np.array([m.step_time_s for m in measurements])
    rms = float(np.sqrt(np.mean(((predicted - actual) / actual) ** 2)))
    return CalibrationResult(eff, rms, len(measurements))


def _solve(memory: np.ndarray, compute: np.ndarray, measured: np.ndarray, memory_bound: np.ndarray,
           prior: Efficiency) -> Efficiency:
    """Weighted NNLS for (fixed, 1/bw_eff, 1/compute_eff); relative weights so short steps count as much as long."""
    design = np.column_stack([np.ones_like(memory), np.where(memory_bound, memory, 0.0),
                              np.where(memory_bound, 0.0, compute)])
    weights = 1.0 / measured
    coef, _ = nnls(design * weights[:, None], measured * weights)
    fixed, inv_bw, inv_compute = coef
    # A regime with no measurements leaves its coefficient at 0: keep the prior there instead of infinity.
    bandwidth = 1.0 / inv_bw if inv_bw > 0 else prior.bandwidth
    compute_eff = 1.0 / inv_compute if inv_compute > 0 else prior.compute
    # The fit sees one model, so per-step and per-layer fixed costs are one term: keep it all as per-step.
    return Efficiency(bandwidth, compute_eff, float(fixed), 0.0)


def _polish(memory: np.ndarray, compute: np.ndarray, measured: np.ndarray, start: Efficiency,
            hold_bandwidth: bool = False) -> Efficiency:
    """Relative-error least squares on t = fixed + max(memory * inv_bw, compute * inv_compute)."""
    held_inv_bw = 1.0 / min(start.bandwidth, 1.0)

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        return (x[0], held_inv_bw, x[1]) if hold_bandwidth else (x[0], x[1], x[2])

    def residuals(x: np.ndarray) -> np.ndarray:
        fixed, inv_bw, inv_compute = unpack(x)
        return (fixed + np.maximum(memory * inv_bw, compute * inv_compute)) / measured - 1.0

    full = np.array([start.step_overhead_s, held_inv_bw, 1.0 / min(start.compute, 1.0)])
    keep = [0, 2] if hold_bandwidth else [0, 1, 2]
    lower, upper = np.array([0.0, 1.0, 1.0])[keep], np.array([max(measured.max(), full[0] * 2), 1e3, 1e3])[keep]
    fit = least_squares(residuals, np.clip(full[keep], lower, upper), bounds=(lower, upper))
    fixed, inv_bw, inv_compute = unpack(fit.x)
    return Efficiency(1.0 / inv_bw, 1.0 / inv_compute, float(fixed), 0.0)
