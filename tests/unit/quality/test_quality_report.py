"""`slotune tune`'s report shows the quality gate's numbers for every change it judged, and nothing for a run
without one (the history is read as the loop writes it: the gate's reason closes the entry's detail)."""

from __future__ import annotations

from datetime import UTC, datetime

from slotune.api import HistoryEntry, Knob, Phase, TunedModelStatus, Verdict, load_tunedmodel
from slotune.knobs import Quantization, RuntimeConfig
from slotune.local.report import markdown, quality_lines
from tests.unit.api_cases import EXAMPLES


def _entry(change: str, verdict: Verdict, reason: str) -> HistoryEntry:
    return HistoryEntry(iteration=3, time=datetime.now(UTC), knob=Knob.QUANTIZATION, change=change, reason=reason,
                        config=RuntimeConfig(quantization=Quantization.INT8), verdict=verdict)


def test_judged_changes_get_a_quality_table_and_others_none() -> None:
    gated = _entry("quantization none -> int8", Verdict.ROLLED_BACK,
                   "decode reads weights (quantization changes outputs) | quality: mean KL 0.0031 > maxMeanKl 0.002 "
                   "(token agreement 0.52, top-1 agreement 0.960, mean KL 0.0031 nats, 5/16 answers identical)")
    plain = _entry("max_num_seqs 1 -> 8", Verdict.KEPT, "queueing | TTFT p99 improved")
    status = TunedModelStatus(phase=Phase.CONVERGED, iteration=4, history=[plain, gated])
    lines = quality_lines(status)
    assert len([line for line in lines if line.startswith("| 3 |")]) == 1
    assert "quality: mean KL 0.0031 > maxMeanKl 0.002" in lines[-1] and "RolledBack" in lines[-1]
    assert "decode reads weights" not in lines[-1]  # the policy's reason is not the gate's
    model = load_tunedmodel(next(p for p in EXAMPLES if p.name == "local-tiny.yaml"))
    assert "## Quality gate" in markdown(model, status)
    assert quality_lines(TunedModelStatus(phase=Phase.CONVERGED, iteration=4, history=[plain])) == []
