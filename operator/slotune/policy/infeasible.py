"""Infeasible: the closest configuration, why nothing allowed can help, and what would be needed (replicas beyond the
bound, a faster accelerator, a smaller model, 8-bit weights)."""

from __future__ import annotations

import math

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.accelerators import ACCELERATORS
from slotune.policy.diagnosis import Bottleneck, Diagnosis
from slotune.policy.inputs import Infeasible, PolicyInput
from slotune.policy.sizing import max_replicas, replicas_for_load, tpot_target


def infeasible(diagnosis: Diagnosis, given: PolicyInput) -> Infeasible:
    closest = given.closest or given.config
    needs = list(_needs(diagnosis, given, closest))
    reason = (f"{diagnosis.bottleneck.value}: no allowed change left that could help "
              f"({', '.join(r.target.name for r in diagnosis.violated)} still violated)")
    if given.futile_moves:
        reason += (f"; {', '.join(sorted(given.futile_moves))} measured not to move the windows that miss at every "
                   "allowed replica")
    if diagnosis.out_of_reach:
        reason = (f"{', '.join(diagnosis.out_of_reach)} below what any allowed config can do on this hardware "
                  f"(the least TPOT floor {diagnosis.floors.reachable_tpot_ms:.1f} ms, "
                  f"{diagnosis.floors.best_config.describe()}, at draft acceptance {diagnosis.acceptance:.2f})")
    return Infeasible(closest, reason, tuple(needs), out_of_reach=diagnosis.out_of_reach)


def _needs(diagnosis: Diagnosis, given: PolicyInput, closest: RuntimeConfig) -> list[str]:
    found = []
    replicas = replicas_for_load(given, closest)
    if diagnosis.bottleneck in (Bottleneck.CAPACITY, Bottleneck.PREFILL) and replicas > max_replicas(given):
        found.append(f"about {replicas} replicas (maxReplicas is {max_replicas(given)})")
    target = tpot_target(given.slo)
    if target is not None and diagnosis.floors.reachable_tpot_ms > target:
        factor = diagnosis.floors.reachable_tpot_ms / target
        faster = [a.name for a in ACCELERATORS.values() if a.memory_bandwidth_bytes_per_s >=
                  factor * given.deployment.accelerator.memory_bandwidth_bytes_per_s]
        found.append(f"an accelerator with {factor:.1f}x the memory bandwidth ({', '.join(faster) or 'none known'}) "
                     f"or tensor parallelism {math.ceil(factor)}")
        found.append(f"a model at most {_params(given.deployment.model.num_params / factor)} parameters")
        if not given.tuning.allow_quality_change:
            found.append("allowQualityChange: true, so 8-bit weights can halve the bytes per token")
    if not found:
        found.append("a faster accelerator, more replicas or a smaller model")
    return found


def _params(count: float) -> str:
    """A parameter count as people write it: 7.0B, 350M, 12K."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return f"{count:.0f}"
