"""The quality gate's decisions (QualityGate, with recorded answers handed in) and its hook in the tuning loop (the
simulator as deployment, the probe answers modelled): an output-altering change is measured and rolled back when it
drifts too far, kept when it stays within bounds; allowQualityChange: false never lets such a knob move."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from slotune.api.quality import QualitySpec
from slotune.api.status import Verdict
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.perfmodel import Deployment
from slotune.quality.gate import QualityGate, alters_outputs
from slotune.quality.probe_set import PROBES
from slotune.quality.record import ProbeAnswer, QualityRecord, RecordFailed, TokenChoice
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

PLAIN = RuntimeConfig()
INT8 = PLAIN.with_changes(quantization=Quantization.INT8)
NGRAM = PLAIN.with_changes(
    speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=4).model_dump())
DEFAULTS = QualitySpec()


def _record(p_first: float, tokens: str = "abcdefgh") -> QualityRecord:
    """Every probe answers `tokens`; the first token's distribution puts p_first on it (the rest on 'z')."""
    def choice(token: str, p: float) -> TokenChoice:
        return TokenChoice(token=token, logprob=math.log(p), top=((token, math.log(p)), ("z", math.log(1 - p))))

    answer = ProbeAnswer(tokens=(choice(tokens[0], p_first), *(choice(t, 0.9) for t in tokens[1:])))
    return QualityRecord(max_tokens=32, answers=(answer,) * len(PROBES))


class Answers:
    """The recorder: hands out the given records in order, and counts the calls."""

    def __init__(self, *records: QualityRecord | Exception) -> None:
        self.records = list(records)
        self.calls = 0

    def __call__(self, urls: Sequence[str], model: str, max_tokens: int) -> QualityRecord:
        self.calls += 1
        found = self.records.pop(0)
        if isinstance(found, Exception):
            raise found
        return found


def _gate(answers: Answers, spec: QualitySpec = DEFAULTS, store: Path | None = None) -> QualityGate:
    return QualityGate(spec, lambda: ["http://replica"], "m", store, recorder=answers)


def test_only_moves_away_from_the_models_own_outputs_are_gated():
    assert alters_outputs(PLAIN, INT8) and alters_outputs(PLAIN, NGRAM)
    assert not alters_outputs(INT8, PLAIN) and not alters_outputs(NGRAM, PLAIN)  # back to the model: nothing to fear
    assert not alters_outputs(PLAIN, PLAIN.with_changes(max_num_seqs=64, replicas=3))
    answers = Answers()
    gate = _gate(answers)
    gate.before(PLAIN, PLAIN.with_changes(max_num_seqs=64))
    assert gate.check(PLAIN, PLAIN.with_changes(max_num_seqs=64)) is None and answers.calls == 0


def test_a_change_within_bounds_is_kept_and_one_beyond_is_not():
    close = _gate(Answers(_record(0.9), _record(0.89)))
    close.before(PLAIN, INT8)
    kept = close.check(PLAIN, INT8)
    assert kept is not None and kept.keep and kept.measurement is not None
    assert kept.measurement.token_agreement == 1.0 and "quality holds" in kept.reason
    far = _gate(Answers(_record(0.9), _record(0.4)))  # same tokens, the first one far less certain
    far.before(PLAIN, INT8)
    broken = far.check(PLAIN, INT8)
    assert broken is not None and not broken.keep and "maxMeanKl" in broken.reason
    assert broken.measurement is not None and broken.measurement.mean_kl > QualitySpec().max_mean_kl


def test_each_bound_is_the_specs():
    drift = (_record(0.9), _record(0.9, tokens="abXdefgh"))  # diverges at the third token of eight
    strict = _gate(Answers(*drift), QualitySpec(min_token_agreement=0.5))
    strict.before(PLAIN, INT8)
    verdict = strict.check(PLAIN, INT8)
    assert verdict is not None and not verdict.keep and "minTokenAgreement" in verdict.reason
    lenient = _gate(Answers(*drift), QualitySpec(min_token_agreement=0.2, min_top1_agreement=0.5, max_mean_kl=10))
    lenient.before(PLAIN, INT8)
    verdict = lenient.check(PLAIN, INT8)
    assert verdict is not None and verdict.keep


def test_it_fails_closed_when_nothing_could_be_measured():
    failing = _gate(Answers(RecordFailed("refused")))
    failing.before(PLAIN, INT8)
    verdict = failing.check(PLAIN, INT8)
    assert verdict is not None and not verdict.keep and "refused" in verdict.reason
    lost = _gate(Answers(_record(0.9)))  # a process that restarted between the change and its verdict
    verdict = lost.check(PLAIN, INT8)
    assert verdict is not None and not verdict.keep and "no reference" in verdict.reason


def test_a_verdict_is_measured_once_and_a_reference_survives_in_its_directory(tmp_path: Path):
    answers = Answers(_record(0.9), _record(0.9))
    gate = _gate(answers, store=tmp_path)
    gate.before(PLAIN, INT8)
    assert gate.check(PLAIN, INT8) == gate.check(PLAIN, INT8) and answers.calls == 2 and len(gate.checks) == 1
    resumed_answers = Answers(_record(0.9))
    resumed = _gate(resumed_answers, store=tmp_path)
    verdict = resumed.check(PLAIN, INT8)  # the reference is read back, only the candidate is recorded
    assert verdict is not None and verdict.keep and resumed_answers.calls == 1


def test_a_disabled_gate_measures_nothing():
    answers = Answers()
    gate = _gate(answers, QualitySpec(enabled=False))
    gate.before(PLAIN, INT8)
    assert gate.check(PLAIN, INT8) is None and answers.calls == 0


# -- in the loop ------------------------------------------------------------------------------------------------------

L4 = Deployment.from_names("llama-3.1-8b", "l4")
LIGHT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=0.3)
TPOT_BOUND = SLOSpec.model_validate({"tpot": {"p50": 60}})  # weight reads bound decode on an L4: 8-bit weights help
OPTED_IN = TuningSpec(cooldown_s=0, min_samples=30, max_iterations=4, allow_quality_change=True,
                      knobs=[Knob.QUANTIZATION], bounds=KnobBounds(max_replicas=1))


def _tune(tuning: TuningSpec, quality: QualityGate | None, seed: int = 0) -> list:
    world = SimulatedDeployment(L4, LIGHT, requests_per_window=60, seed=seed)
    tuner = Tuner(TuningProblem(TPOT_BOUND, tuning, L4, PLAIN, LIGHT), world, world, MemoryStateStore(),
                  quality=quality)
    return list(tuner.run(max_windows=8).history)


def test_the_loop_rolls_back_quantization_whose_outputs_drift_and_keeps_one_that_holds():
    drifted = _tune(OPTED_IN, _gate(Answers(_record(0.9), _record(0.3))))
    quantized = [h for h in drifted if h.knob is Knob.QUANTIZATION]
    assert quantized and quantized[0].verdict is Verdict.ROLLED_BACK
    assert "maxMeanKl" in quantized[0].detail and "mean KL" in quantized[0].detail
    held = _tune(OPTED_IN, _gate(Answers(_record(0.9), _record(0.9))))
    quantized = [h for h in held if h.knob is Knob.QUANTIZATION]
    assert quantized and quantized[0].verdict is Verdict.KEPT and "quality holds" in quantized[0].detail


@pytest.mark.parametrize("seed", [0, 1])
def test_without_allow_quality_change_no_output_altering_knob_ever_moves(seed: int):
    """Where 8-bit weights are the policy's first remedy with the opt-in, without it no config the loop tries changes
    quantization or the KV cache dtype, and the rule refuses those knobs in the spec at all."""
    history = _tune(TuningSpec(cooldown_s=0, min_samples=30, max_iterations=4, bounds=KnobBounds(max_replicas=1)),
                    None, seed)
    assert all(h.config.quantization is Quantization.NONE and h.config.kv_cache_dtype == PLAIN.kv_cache_dtype
               for h in history)
    with pytest.raises(ValueError, match="allowQualityChange"):
        TuningSpec(knobs=[Knob.QUANTIZATION])
    with pytest.raises(ValueError, match="allowQualityChange"):
        TuningSpec(knobs=[Knob.KV_CACHE_DTYPE])


# -- local mode's wiring ----------------------------------------------------------------------------------------------

def test_slotune_tune_hands_its_tuner_a_gate_whose_references_a_fresh_run_drops(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    from gpu_runtime.model_source import resolve_model
    from slotune.api import load_tunedmodel
    from slotune.local.command import LocalRun
    from tests.unit.api_cases import EXAMPLES

    # The tuner reads the preset's config.json, which the runtime writes when `slotune tune` starts it: built here
    # into this test's own cache, so the test does not depend on a runtime test having run first.
    monkeypatch.setenv("SLOTUNE_MODEL_CACHE", str(tmp_path / "models"))
    resolve_model("builtin://tiny")
    model = load_tunedmodel(next(p for p in EXAMPLES if p.name == "local-tiny.yaml"))
    stale = tmp_path / "quality" / "reference-0.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    resumed = LocalRun(model, "builtin://tiny", tmp_path, None, resume=True)
    assert stale.exists() and resumed.quality.spec == model.spec.quality
    fresh = LocalRun(model, "builtin://tiny", tmp_path, None, resume=False)
    assert not stale.exists()  # an earlier run's references may be of another model
    assert fresh.quality.store_dir == tmp_path / "quality" and fresh.quality.model == model.spec.model.name
    assert fresh.tuner().quality is fresh.quality


def test_the_gate_says_when_its_last_probe_run_ended_failed_or_not():
    now = [100.0]

    def answers(urls: Sequence[str], model: str, max_tokens: int) -> QualityRecord:
        now[0] += 25.0  # the probe set takes 25 s
        if now[0] > 150.0:
            raise RecordFailed("replica gone")
        return _record(0.9)

    gate = QualityGate(DEFAULTS, lambda: ["http://replica"], "m", recorder=answers, clock=lambda: now[0])
    assert gate.probed_until_s == -math.inf
    gate.before(PLAIN, INT8)  # the reference: 100 -> 125 s
    assert gate.probed_until_s == 125.0
    gate.check(PLAIN, INT8)  # the candidate: 125 -> 150 s
    assert gate.probed_until_s == 150.0
    gate.before(INT8, NGRAM)  # fails at 175 s: its requests still reached the pods until then
    assert gate.probed_until_s == 175.0
