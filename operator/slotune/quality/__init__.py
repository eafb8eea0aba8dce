"""The quality gate: a fixed probe set answered before and after a change that can alter outputs, compared, and held
to `spec.quality` (probe_set, record, compare, gate)."""

from slotune.quality.gate import QualityCheck, QualityGate, QualityProbe, QualityVerdict, alters_outputs

__all__ = ["QualityCheck", "QualityGate", "QualityProbe", "QualityVerdict", "alters_outputs"]
