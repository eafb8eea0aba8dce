"""The honesty metrics: slotune's keeps, rollbacks, GPUs, output-altering changes and trims, judged noise-free."""

from __future__ import annotations

import pytest

from slotune.knobs import Quantization, SpeculativeConfig, SpeculativeMethod
from slotune.tunerbench.evaluator import Evaluator
from slotune.tunerbench.honesty import (
    Honesty,
    above_oracle,
    judge,
    sound,
    unneeded_output_changes,
    windows_missed_after_trim,
)
from slotune.tunerbench.honesty_report import family_of, honesty_lines, summarise_honesty
from slotune.tunerbench.run import ScenarioResult, StrategyResult
from slotune.tunerbench.scenario import Scenario
from slotune.tunerbench.strategies import Decision, MeasuredWindow, Trace

CHAT = {
    "name": "chat-small", "model": "llama-3.1-8b", "accelerator": "nvidia-h100-80gb",
    "workload": {"profile": "chat", "requestRatePerS": 30}, "slo": {"ttft": {"p99": 2000}, "tpot": {"p99": 100}},
    "start": {"maxNumSeqs": 4, "replicas": 1},
    "tuning": {"knobs": ["max_num_seqs", "replicas", "speculative", "quantization"], "bounds": {"maxReplicas": 2},
               "allowQualityChange": True},
    "requestsPerWindow": 60,
}
NGRAM = SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=4)


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(Scenario.model_validate(CHAT))


@pytest.fixture(scope="module")
def configs(evaluator):
    start = evaluator.scenario.start
    small, fits, margin = start, start.with_changes(max_num_seqs=64), start.with_changes(max_num_seqs=64, replicas=2)
    assert not evaluator.evaluate(small).met and evaluator.holds(fits) and evaluator.holds(margin)
    return small, fits, margin


def test_a_fix_is_sound_when_it_stands_better_and_a_margin_replica_is_not(evaluator, configs):
    small, fits, margin = configs
    assert sound(evaluator, Decision(small, fits, kept=True, trim=False, window=2))
    assert not sound(evaluator, Decision(fits, margin, kept=True, trim=False, window=4))  # more GPUs, same outcome
    assert not sound(evaluator, Decision(fits, fits.with_changes(max_num_seqs=65), kept=True, trim=False, window=4))


def test_a_trim_is_sound_when_its_config_still_holds(evaluator, configs):
    small, fits, margin = configs
    assert sound(evaluator, Decision(margin, fits, kept=True, trim=True, window=6))
    assert not sound(evaluator, Decision(fits, small, kept=True, trim=True, window=6))


def test_false_keeps_and_false_rollbacks_count_against_the_noise_free_verdict(evaluator, configs):
    small, fits, margin = configs
    trace = Trace("slotune", final=margin, decisions=[
        Decision(small, fits, kept=True, trim=False, window=2),  # sound, kept
        Decision(fits, margin, kept=True, trim=False, window=4),  # a replica for margin, kept: false keep
        Decision(margin, fits, kept=False, trim=True, window=6),  # a sound trim rolled back: false rollback
        Decision(fits, small, kept=False, trim=True, window=8),  # a trim that breaks the SLO, rolled back
    ])
    honesty = judge(trace, evaluator, tensor_parallel=2)
    assert honesty == Honesty(keeps=2, false_keeps=1, rollbacks=2, false_rollbacks=1, gpus_at_rest=4,
                              unneeded_output_changes=(), windows_measured=0, windows_missed_after_trim=0,
                              false_rollbacks_held=1)  # the trim rolled back held the SLO


def test_a_missed_window_counts_against_a_trim_only_when_the_config_before_it_meets_that_window(evaluator, configs):
    small, fits, margin = configs
    windows = [
        MeasuredWindow(1, 0, 0, 1.0, small, met=False, trimmed_from=fits),  # the trim's miss: before it, met
        MeasuredWindow(2, 0, 1, 1.0, small, met=False, trimmed_from=small),  # before it missed as well
        MeasuredWindow(3, 0, 0, 1.0, fits, met=True, trimmed_from=margin),  # met: no cost
        MeasuredWindow(4, 0, 2, 1.0, small, met=False),  # no trim led to it
    ]
    assert windows_missed_after_trim(Trace("slotune", windows=windows), evaluator) == 1


def test_an_output_altering_change_is_unneeded_when_the_final_config_holds_without_it(evaluator, configs):
    _, fits, _ = configs
    assert unneeded_output_changes(evaluator, fits) == ()
    both = fits.with_changes(quantization=Quantization.FP8, speculative=NGRAM)
    assert unneeded_output_changes(evaluator, both) == ("quantization", "speculative")


def test_speculation_the_tpot_needs_is_not_unneeded():
    fast = Scenario.model_validate(CHAT | {"name": "tpot-4", "workload": {"profile": "chat", "requestRatePerS": 4},
                                           "slo": {"ttft": {"p99": 2000}, "tpot": {"p99": 4}},
                                           "specAcceptanceRate": 0.9})
    evaluator = Evaluator(fast)
    drafted = fast.start.with_changes(max_num_seqs=8, speculative=NGRAM.model_copy(
        update={"num_speculative_tokens": 8}))
    assert evaluator.holds(drafted) and not evaluator.holds(drafted.with_changes(speculative=None))
    assert unneeded_output_changes(evaluator, drafted) == ()


def _result(name: str, feasible: bool, oracle_gpus: int, honesty: Honesty, reached: bool = True) -> ScenarioResult:
    mine = StrategyResult("slotune", 1 if reached else None, 1.0, 0, False, (1.0,), "-", honesty=honesty)
    return ScenarioResult(name, feasible, 1.0, "-", False, 1, (mine,), oracle_gpus=oracle_gpus)


def test_the_report_sums_per_family_and_says_which_bar_fails():
    calm = Honesty(3, 0, 1, 0, 1, (), 10, 0)
    noisy = Honesty(4, 1, 2, 1, 3, ("speculative",), 12, 1)
    results = [_result("noisy-chat-h100", True, 2, noisy), _result("chat-h100-relaxed", False, 1, calm)]
    assert [family_of(r.scenario) for r in results] == ["noisy", "other"]
    rows = {f.family: f for f in summarise_honesty(results)}
    assert set(rows) == {"noisy", "other", "all"}
    total = rows["all"]
    assert (total.changes_judged, total.false_keeps, total.false_rollbacks) == (10, 1, 1)
    assert (total.gpus_at_rest, total.gpus_oracle, total.above_oracle) == (4, 3, ("noisy-chat-h100",))
    assert total.unneeded_output_changes == ("noisy-chat-h100: speculative",)
    assert total.windows_missed_after_trim == 1
    text = "\n".join(honesty_lines(results))
    assert "GPUs at rest <= the oracle's on every scenario: FAILS (1 above: noisy-chat-h100)" in text
    assert "false rollbacks <= 5% of changes: FAILS (1 of 10, 10.0%; on the feasible scenarios FAILS: 1 of 6, " \
        "16.7%); 0 of the 1 undid a config that holds the SLO" in text
    assert "every feasible scenario reaches its SLO: holds (1 of 1)" in text


def test_resting_above_the_oracle_says_what_each_config_does_noise_free(evaluator, configs):
    """A replica more than the oracle reads apart from one the config needs: the report says, noise-free, what the
    final config does on its replicas and on the oracle's, and what the oracle's does."""
    small, fits, margin = configs
    assert above_oracle(evaluator, fits, margin) == ""  # resting on fewer: nothing to explain
    text = above_oracle(evaluator, margin, fits)
    assert text.startswith("noise-free, slotune's final config holds on 2 replicas, holds on the oracle's 1; ")
    assert text.endswith(f"the oracle's config holds: {fits.describe()}")
    needs = above_oracle(evaluator, small.with_changes(replicas=2), fits)
    assert "on 2 replicas, misses by x" in needs and "on the oracle's 1" in needs
    mine = StrategyResult("slotune", 1, 1.0, 0, False, (1.0,), "-", honesty=Honesty(2, 1, 0, 0, 2, (), 4, 0),
                          above_oracle=text)
    report = "\n".join(honesty_lines([ScenarioResult("chat-small", True, 1.0, "-", False, 1, (mine,), oracle_gpus=1)]))
    assert f"FAILS (1 above: chat-small ({text}));" in report
