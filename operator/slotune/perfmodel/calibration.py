"""Refit the roofline's efficiencies, fixed cost and host-side terms from measured step times, by least squares.

The step model is t = fixed + max(memory_s / bandwidth_eff, compute_s / compute_eff) + host terms, each a cost times
a count of the step (sequences, prefill sequences, new sequences, decode context tokens, prefill attention pairs,
prefill context pairs; see `roofline`). For a given assignment of each measured step to its bound regime that is
linear in all coefficients (fixed, 1/bandwidth_eff, 1/compute_eff, the host costs), so we alternate: assign regimes
with the current fit, solve the non-negative least-squares problem (scipy's NNLS, Lawson & Hanson 1974), repeat
until the assignment stops changing. That start is then polished by bounded nonlinear least squares on the max()
model itself (efficiencies in (0, 1], costs >= 0), minimising relative errors. Measurements come from the runtime's
own step timings (its opt-in step trace, `GPU_RUNTIME_STEP_TRACE`, one line per step with its shape) or from a
benchmark.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares, nnls

from slotune.perfmodel.roofline import Efficiency, StepShape, StepTimeModel

MAX_ROUNDS = 10
IDENTIFIABLE_SPREAD = 2.0  # bytes read must vary this much across steps to separate bandwidth from fixed cost
NUM_HOST_TERMS = 6


@dataclass(frozen=True)
class StepMeasurement:
    shape: StepShape
    step_time_s: float


@dataclass(frozen=True)
class CalibrationResult:
    efficiency: Efficiency
    rms_relative_error: float  # root mean square of (predicted - measured) / measured after the fit
    num_measurements: int


@dataclass(frozen=True)
class _Features:
    """Per-measurement terms of the step model, as columns."""

    memory: np.ndarray
    compute: np.ndarray
    host: np.ndarray  # [n, 6]: seqs, prefill seqs, new seqs, decode context tokens, prefill attention, context pairs
    measured: np.ndarray  # step time minus the communication term, which calibration does not fit


def calibrate(model: StepTimeModel, measurements: Sequence[StepMeasurement],
              fit_host_terms: bool = True) -> CalibrationResult:
    """Fit the fixed per-step cost, both efficiencies and (unless told not to) the host-side terms of `model`."""
    if len(measurements) < 3:
        raise ValueError(f"need at least 3 step measurements to fit 3 terms, got {len(measurements)}")
    features = _features(model, measurements, fit_host_terms)
    eff = model.eff
    memory_bound = features.memory / eff.bandwidth >= features.compute / eff.compute
    for _ in range(MAX_ROUNDS):
        eff = _solve(features, memory_bound, model.eff)
        new_bound = features.memory / eff.bandwidth >= features.compute / eff.compute
        if np.array_equal(new_bound, memory_bound):
            break
        memory_bound = new_bound
    # Every step reading about the same bytes (one model's weights) makes a fixed cost and 1/bandwidth collinear:
    # bandwidth then stays at the prior and the fit explains the rest with the other terms.
    hold_bandwidth = bool(features.memory.max() < IDENTIFIABLE_SPREAD * features.memory.min())
    if hold_bandwidth:
        eff = replace(eff, bandwidth=model.eff.bandwidth)
    eff = _polish(features, eff, hold_bandwidth)
    if not fit_host_terms:
        prior = model.eff
        eff = replace(eff, seq_overhead_s=prior.seq_overhead_s, prefill_seq_overhead_s=prior.prefill_seq_overhead_s,
                      new_seq_overhead_s=prior.new_seq_overhead_s,
                      decode_context_token_s=prior.decode_context_token_s,
                      prefill_attention_pair_s=prior.prefill_attention_pair_s,
                      prefill_context_pair_s=prior.prefill_context_pair_s)
    fitted_model = replace(model, efficiency=eff)
    predicted = np.array([fitted_model.step_time_s(m.shape) for m in measurements])
    actual = np.array([m.step_time_s for m in measurements])
    rms = float(np.sqrt(np.mean(((predicted - actual) / actual) ** 2)))
    return CalibrationResult(eff, rms, len(measurements))


def _features(model: StepTimeModel, measurements: Sequence[StepMeasurement], fit_host_terms: bool) -> _Features:
    costs = [model.cost(m.shape) for m in measurements]
    host = np.array([_host_terms(m.shape) for m in measurements], dtype=float)
    if not fit_host_terms:  # the model's own host terms are then part of what is measured
        fixed_host = np.array([model.eff.host_s(m.shape) for m in measurements])
        host = np.zeros((len(measurements), NUM_HOST_TERMS))
    else:
        fixed_host = np.zeros(len(measurements))
    measured = np.array([m.step_time_s for m in measurements]) - np.array([c.comm_s for c in costs]) - fixed_host
    return _Features(np.array([c.memory_s for c in costs]), np.array([c.compute_s for c in costs]), host, measured)


def _host_terms(shape: StepShape) -> list[float]:
    """The step's counts that the host-side terms multiply, in Efficiency's field order."""
    return [shape.num_seqs, shape.num_seqs - shape.num_decode_seqs, shape.num_new_seqs,
            shape.decode_context_tokens * shape.tokens_per_decode_seq, shape.prefill_attention_tokens,
            shape.prefill_context_pairs]


def _solve(f: _Features, memory_bound: np.ndarray, prior: Efficiency) -> Efficiency:
    """Weighted NNLS for (fixed, 1/bw_eff, 1/compute_eff, host terms); relative weights so short steps count as much
    as long ones."""
    design = np.column_stack([np.ones_like(f.memory), np.where(memory_bound, f.memory, 0.0),
                              np.where(memory_bound, 0.0, f.compute), f.host])
    weights = 1.0 / f.measured
    coef, _ = nnls(design * weights[:, None], f.measured * weights)
    fixed, inv_bw, inv_compute, *host = coef
    # A regime with no measurements leaves its coefficient at 0: keep the prior there instead of infinity.
    bandwidth = 1.0 / inv_bw if inv_bw > 0 else prior.bandwidth
    compute_eff = 1.0 / inv_compute if inv_compute > 0 else prior.compute
    # The fit sees one model, so per-step and per-layer fixed costs are one term: keep it all as per-step.
    return Efficiency(bandwidth, compute_eff, float(fixed), 0.0, *(float(h) for h in host))


def _polish(f: _Features, start: Efficiency, hold_bandwidth: bool) -> Efficiency:
    """Relative-error least squares on t = fixed + max(memory * inv_bw, compute * inv_compute) + host @ terms."""
    held_inv_bw = 1.0 / min(start.bandwidth, 1.0)
    num = 3 + NUM_HOST_TERMS
    keep = [i for i in range(num) if not (hold_bandwidth and i == 1)]

    def unpack(x: np.ndarray) -> np.ndarray:
        full = np.full(num, held_inv_bw)
        full[keep] = x
        return full

    def residuals(x: np.ndarray) -> np.ndarray:
        fixed, inv_bw, inv_compute, *host = unpack(x)
        predicted = fixed + np.maximum(f.memory * inv_bw, f.compute * inv_compute) + f.host @ np.array(host)
        return predicted / f.measured - 1.0

    full = np.array([start.step_overhead_s, held_inv_bw, 1.0 / min(start.compute, 1.0), start.seq_overhead_s,
                     start.prefill_seq_overhead_s, start.new_seq_overhead_s,
                     start.decode_context_token_s, start.prefill_attention_pair_s, start.prefill_context_pair_s])
    upper_fixed = max(f.measured.max(), full[0] * 2)
    lower = np.array([0.0, 1.0, 1.0] + [0.0] * NUM_HOST_TERMS)[keep]
    upper = np.array([upper_fixed, 1e3, 1e3] + [upper_fixed] * NUM_HOST_TERMS)[keep]
    fit = least_squares(residuals, np.clip(full[keep], lower, upper), bounds=(lower, upper))
    fixed, inv_bw, inv_compute, *host = unpack(fit.x)
    return Efficiency(1.0 / inv_bw, 1.0 / inv_compute, float(fixed), 0.0, *(float(h) for h in host))


BUSY_GAP_S = 0.001  # a step that starts within this of the previous one's end followed it without idling


def step_trace_measurements(lines: Sequence[str]) -> list[StepMeasurement]:
    """Measurements from the runtime's step trace (JSON lines, see gpu_runtime.engine.step_trace).

    A step's time is taken from its start to the next step's start, so the engine loop's own work between steps
    (metrics, handing outputs to the HTTP side) counts, as it does for the tokens the client sees; the last step
    before an idle wait has no such successor and is left out.
    """
    rows = [json.loads(line) for line in lines if line.strip()]
    measurements = []
    for row, following in itertools.pairwise(rows):
        if following["start_s"] - row["end_s"] > BUSY_GAP_S:
            continue
        shape = StepShape(num_prefill_tokens=int(row["num_prefill_tokens"]),
                          prefill_attention_tokens=float(row["prefill_attention_tokens"]),
                          num_decode_seqs=int(row["num_decode_seqs"]),
                          decode_context_tokens=float(row["decode_context_tokens"]),
                          num_prefill_seqs=int(row["num_prefill_seqs"]),
                          prefill_context_pairs=float(row.get("prefill_context_pairs", 0.0)),
                          num_new_seqs=int(row.get("num_new_seqs", 0)))
        measurements.append(StepMeasurement(shape, following["start_s"] - row["start_s"]))
    return measurements
