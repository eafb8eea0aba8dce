"""The saved tuner state stays readable across versions: the operator keeps it beside the resource's status and local
mode in a file, so an operator upgraded mid-change must resume the change it finds. The files in tests/unit/data were
written by the code before the state was regrouped (issue 31, commit 91aa3ec's TuningState): a live canary mid-change
(pooled inconclusive look, history with a futile keep, a lucky keep, futile and rolled-back moves, a short window,
a met streak, the load reference) and a run at rest, Infeasible. Each is loaded by today's code and its facts checked.
"""

from __future__ import annotations

import json
from pathlib import Path

from slotune.api.status import Phase, TunedModelStatus, Verdict
from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.loop.state import TuningState
from slotune.snapshot import LatencyMetric

DATA = Path(__file__).resolve().parents[1] / "data"
OLD = RuntimeConfig(max_num_seqs=4, replicas=3)
LARGER = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=512, replicas=4)


def _load(name: str) -> TuningState:
    return TuningState.from_json((DATA / name).read_text())


def _facts(state: TuningState) -> dict[str, object]:
    """The facts a resumed loop acts on, read through today's field names."""
    pending, measured, learned, convergence = state.pending, state.measured, state.learned, state.convergence
    assert pending is not None and pending.canary_pool is not None and learned.lucky is not None
    proposal, pool = pending.proposal, pending.canary_pool
    return {
        "phase": state.phase, "iteration": state.iteration, "changes_applied": state.changes_applied,
        "current": state.current, "running": state.running,
        "pending": (proposal.config, pending.previous, proposal.knob, proposal.change, proposal.reason,
                    proposal.target_metric, proposal.target_percentile, proposal.trim, pending.applied),
        "canary": (pending.canary_pod, pending.canary_endpoint, pool.looks, pool.canary.num_requests,
                   pool.baseline.num_requests),
        "drain": (pending.drain_windows, pending.drain_backlog, pending.rebaseline, pending.rebaselined),
        "baseline_requests": measured.baseline.num_requests if measured.baseline else None,
        "history": [(h.verdict, h.knob, h.change, "does not move the windows that miss" in h.detail)
                    for h in state.history],
        "futile_moves": learned.futile_moves, "rolled_back_moves": learned.rolled_back_moves,
        "lucky": (learned.lucky.move, learned.lucky.config_key == LARGER.key(), learned.lucky.baseline.num_requests),
        "tried": learned.tried_keys == frozenset({OLD.key(), OLD.with_changes(max_num_seqs=32).key()}),
        "failed_keys": learned.failed_keys, "best": learned.best, "best_badness": round(learned.best_badness or 0, 6),
        "short": (measured.short.num_requests if measured.short else None, measured.short_of),
        "streak": (len(measured.streak), measured.streak_of, convergence.windows_met, convergence.windows_missed,
                   convergence.forgiven_of),
        "load_reference": [(w.requests, w.seconds) for w in convergence.load_reference],
        "learned": (learned.speed_ratios, learned.spec_acceptance, learned.prepared_replicas, learned.noise_floor),
        "report": (measured.metrics_available, measured.slo_met, state.infeasible, convergence.settled, state.rollout),
    }


def test_a_state_saved_mid_canary_resumes_with_every_fact() -> None:
    state = _load("tuning_state_mid_canary.json")
    assert _facts(state) == {
        "phase": Phase.VERIFYING, "iteration": 8, "changes_applied": 1,
        "current": OLD, "running": OLD,  # during a canary every other pod runs the previous config
        "pending": (OLD.with_changes(max_num_seqs=32), OLD, Knob.MAX_NUM_SEQS, "maxNumSeqs 4 -> 32", "queueing",
                    LatencyMetric.TTFT, 99, False, True),
        "canary": ("p0", None, 1, 200, 400),
        "drain": (0, None, False, False),
        "baseline_requests": 600,
        "history": [(Verdict.KEPT, Knob.MAX_NUM_BATCHED_TOKENS, "max_num_batched_tokens 256 -> 512", True)],
        "futile_moves": ("max_num_batched_tokens up",), "rolled_back_moves": ("max_num_seqs up",),
        "lucky": ("max_num_batched_tokens up", True, 300),
        "tried": True, "failed_keys": frozenset({"bad-config-key"}), "best": LARGER, "best_badness": 2.589883,
        "short": (300, OLD.describe()),
        "streak": (1, LARGER.describe(), 1, 0, LARGER.describe()),
        "load_reference": [(300, 10.0)],
        "learned": ((1.12, 0.97), 0.61, 2, None),
        "report": (True, False, None, False, None),
    }


def test_its_status_is_the_one_the_old_code_rendered() -> None:
    """What kubectl shows of a resumed state is unchanged (the status the old code rendered from the same file)."""
    state = _load("tuning_state_mid_canary.json")
    expected = TunedModelStatus.model_validate(json.loads((DATA / "tuning_state_mid_canary.status.json").read_text()))
    assert state.to_status() == expected


def test_a_state_at_rest_resumes_at_rest() -> None:
    state = _load("tuning_state_infeasible.json")
    assert state.phase is Phase.INFEASIBLE and state.at_rest and state.pending is None
    assert state.current == LARGER and state.infeasible is not None and state.infeasible.closest == LARGER
    assert "max_num_batched_tokens up measured not to move" in state.infeasible.reason
    assert state.learned.futile_moves == ("max_num_batched_tokens up",)
    assert [w.requests for w in state.convergence.load_reference] == [300]


def test_today_s_state_reads_back_as_itself() -> None:
    for name in ("tuning_state_mid_canary.json", "tuning_state_infeasible.json"):
        state = _load(name)
        assert TuningState.from_json(state.to_json()) == state
