"""TunedModel status: plain data the loop writes and reads back, bounded so it fits an object."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from slotune.api import (
    MAX_HISTORY,
    Condition,
    ConditionStatus,
    ConditionType,
    DiagnosisReport,
    HistoryEntry,
    Knob,
    Observed,
    Phase,
    TunedModelStatus,
    Verdict,
)
from slotune.knobs import RuntimeConfig
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def snapshot() -> MetricsSnapshot:
    return MetricsSnapshot(
        source=Source.CLIENT, window_s=30, num_requests=300,
        ttft=LatencySummary.from_samples([10.0, 20.0, 30.0, 400.0]),
        tpot=LatencySummary.from_samples([5.0, 6.0, 7.0]), generation_tokens_per_s=1234.5, prefix_cache_hit_rate=0.4,
    )


def full_status() -> TunedModelStatus:
    observed = Observed.of(snapshot())
    return TunedModelStatus(
        phase=Phase.TUNING, slo_met=False, iteration=2, message="queueing dominates TTFT",
        conditions=[Condition(type=ConditionType.SLO_MET, status=ConditionStatus.FALSE, reason="TTFTOverTarget",
                              last_transition_time=NOW)],
        observed=observed,
        diagnosis=DiagnosisReport(bottleneck="capacity", evidence=["queue p99 300 ms"], confidence=0.8),
        config=RuntimeConfig(max_num_seqs=64), best_config=RuntimeConfig(),
        history=[HistoryEntry(iteration=1, time=NOW, knob=Knob.MAX_NUM_SEQS, change="max_num_seqs 256 -> 64",
                              reason="capacity", before=observed, after=observed, verdict=Verdict.KEPT,
                              config=RuntimeConfig(max_num_seqs=64))],
    )


def test_observed_carries_the_snapshot_percentiles_in_ms() -> None:
    observed = Observed.of(snapshot())
    assert observed.ttft.p99_ms == pytest.approx(snapshot().ttft.p99_ms)
    assert observed.tpot.p50_ms == 6.0 and observed.e2e.p99_ms is None
    assert observed.source == "client" and observed.generation_tokens_per_s == 1234.5


def test_status_wire_form_round_trips() -> None:
    status = full_status()
    wire = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["observed"]["ttft"]["p99"] == pytest.approx(status.observed.ttft.p99_ms)
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert wire["bestConfig"]["maxNumSeqs"] == 256 and wire["sloMet"] is False
    assert "windowSeconds" in wire["observed"] and "generationTokensPerSecond" in wire["observed"]
    assert TunedModelStatus.model_validate(wire) == status


def test_condition_lookup() -> None:
    status = full_status()
    assert status.condition(ConditionType.SLO_MET).status is ConditionStatus.FALSE
    assert status.condition(ConditionType.READY) is None


def test_history_is_bounded() -> None:
    entry = full_status().history[0]
    TunedModelStatus(history=[entry] * MAX_HISTORY)
    with pytest.raises(ValidationError, match="at most 20"):
        TunedModelStatus(history=[entry] * (MAX_HISTORY + 1))


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValidationError, match="phase"):
        TunedModelStatus.model_validate({"phase": "Done"})
