"""The quality gate never holds a step (issue 15's loop that never parks a thread): with recordings in the
background, the change stays an intent while the reference is recorded, and the window in which the candidate's
probe set still runs is not judged (its requests are in it); the verdict comes on a later step."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob
from slotune.knobs import Quantization
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.quality.gate import QualityGate, in_background
from slotune.quality.record import QualityRecord
from slotune.simulator.backend import SimulatedDeployment
from tests.unit.quality.test_quality_gate import DEFAULTS, INT8, L4, LIGHT, OPTED_IN, PLAIN, TPOT_BOUND, _record


class HeldAnswers:
    """A recorder whose every recording waits until the test lets it finish (a probe run on a slow replica)."""

    def __init__(self, record: QualityRecord) -> None:
        self.record = record
        self.started = threading.Semaphore(0)
        self.release = threading.Semaphore(0)

    def __call__(self, urls: Sequence[str], model: str, max_tokens: int) -> QualityRecord:
        self.started.release()
        assert self.release.acquire(timeout=60), "the test never let the recording finish"
        return self.record


def test_a_gate_in_the_background_answers_not_yet_until_its_recording_is_done():
    held = HeldAnswers(_record(0.9))
    gate = QualityGate(DEFAULTS, lambda: ["http://replica"], "m", recorder=held, submit=in_background)
    assert gate.before(PLAIN, INT8) is False
    assert held.started.acquire(timeout=60)
    assert gate.before(PLAIN, INT8) is False  # asked again while it runs: no second recording
    held.release.release()
    while not gate.before(PLAIN, INT8):
        threading.Event().wait(0.01)
    pending = gate.check(PLAIN, INT8)
    assert pending is not None and pending.pending and not gate.checks
    held.release.release()
    while (verdict := gate.check(PLAIN, INT8)) is not None and verdict.pending:
        threading.Event().wait(0.01)
    assert verdict is not None and verdict.keep and len(gate.checks) == 1


def test_the_loop_keeps_stepping_while_the_probe_runs_and_judges_after_it():
    held = HeldAnswers(_record(0.9))
    gate = QualityGate(DEFAULTS, lambda: ["http://replica"], "m", recorder=held, submit=in_background)
    world = SimulatedDeployment(L4, LIGHT, requests_per_window=60, seed=0)
    tuner = Tuner(TuningProblem(TPOT_BOUND, OPTED_IN, L4, PLAIN, LIGHT), world, world, MemoryStateStore(),
                  quality=gate)
    state = tuner.step()
    for _ in range(8):  # until the loop decides on 8-bit weights: then the reference is being recorded
        if state.pending is not None:
            break
        state = tuner.step()
    assert state.pending is not None and state.pending.proposal.knob is Knob.QUANTIZATION
    assert not state.pending.applied and "recording the quality reference" in state.message
    assert held.started.acquire(timeout=60)
    again = tuner.step()  # returns at once: the recording still runs, the change is still an intent
    assert again.pending is not None and not again.pending.applied
    assert world.running is not None and world.running.quantization is Quantization.NONE
    held.release.release()
    while (state := tuner.step()).pending is not None and not state.pending.applied:
        threading.Event().wait(0.01)
    assert state.pending is not None and world.running == state.pending.config and state.phase is Phase.VERIFYING
    assert world.running.quantization is not Quantization.NONE  # 8-bit weights (fp8 on an L4)
    assert held.started.acquire(timeout=60)  # the candidate's probe run began as soon as it served
    unjudged = tuner.step()
    assert "not judged" in unjudged.message and unjudged.pending is not None and not unjudged.history
    held.release.release()
    while (state := tuner.step()).pending is not None:
        threading.Event().wait(0.01)
    assert [h.verdict for h in state.history if h.knob is Knob.QUANTIZATION] == [Verdict.KEPT]
    assert "quality holds" in state.history[-1].detail
