"""bench-tuner: scenario files load (or fail with the file's name), every strategy runs, results are written."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from slotune.tunerbench import command
from slotune.tunerbench.evaluator import Evaluator
from slotune.tunerbench.scenario import Scenario, load_scenarios
from slotune.tunerbench.space import all_configs
from slotune.tunerbench.strategies import run_slotune

FEASIBLE = {
    "name": "chat-small", "model": "llama-3.1-8b", "accelerator": "nvidia-h100-80gb",
    "workload": {"profile": "chat", "requestRatePerS": 30}, "slo": {"ttft": {"p99": 2000}, "tpot": {"p99": 100}},
    "start": {"maxNumSeqs": 4, "replicas": 1},
    "tuning": {"knobs": ["max_num_seqs", "replicas"], "bounds": {"maxReplicas": 2}}, "requestsPerWindow": 60,
}
PREFIX_HEAVY = {
    "name": "prefix-heavy-h100-interactive", "model": "llama-3.1-8b", "accelerator": "nvidia-h100-80gb",
    "workload": {"profile": "prefix-heavy", "requestRatePerS": 80}, "slo": {"ttft": {"p99": 500}, "tpot": {"p99": 30}},
    "start": {"maxNumSeqs": 16, "maxNumBatchedTokens": 1024, "enablePrefixCaching": False, "replicas": 1},
    "tuning": {"bounds": {"maxReplicas": 4}}, "specAcceptanceRate": 0.45,
}
INFEASIBLE = FEASIBLE | {"name": "l4-too-fast", "accelerator": "nvidia-l4",
                         "workload": {"profile": "chat", "requestRatePerS": 0.5},
                         "slo": {"tpot": {"p99": 20}}}


def _write(folder, *bodies):
    folder.mkdir()
    for body in bodies:
        (folder / f"{body['name']}.yaml").write_text(yaml.safe_dump(body))
    return folder


def test_scenarios_load_sorted_and_their_space_respects_knobs_and_bounds(tmp_path):
    scenarios = load_scenarios(_write(tmp_path / "s", INFEASIBLE, FEASIBLE))
    assert [s.name for s in scenarios] == ["chat-small", "l4-too-fast"]
    configs = all_configs(scenarios[0])
    assert {c.replicas for c in configs} == {1, 2}
    assert {c.max_num_seqs for c in configs} == {8, 64, 256}
    assert len(configs) == 6  # only the allowed knobs vary


def test_a_bad_scenario_names_its_file(tmp_path):
    folder = _write(tmp_path / "s", FEASIBLE | {"name": "broken", "slo": {}})
    with pytest.raises(ValueError, match=r"broken\.yaml"):
        load_scenarios(folder)


def test_bench_runs_every_strategy_and_writes_json_markdown_and_plot(tmp_path):
    folder = _write(tmp_path / "s", FEASIBLE, INFEASIBLE)
    out = tmp_path / "out"
    args = argparse.Namespace(scenarios=folder, out=out, budget=4, seeds=2, jobs=1, only="")
    assert command.run(args) == 0
    body = json.loads((out / "tuner.json").read_text())
    assert [s["strategy"] for s in body["summary"]] == ["slotune", "grid", "random", "tpe"]
    by_name = {s["scenario"]: s for s in body["scenarios"]}
    assert by_name["chat-small"]["feasible"] and not by_name["l4-too-fast"]["feasible"]
    mine = {s["scenario"]: next(r for r in s["results"] if r["strategy"] == "slotune") for s in body["scenarios"]}
    assert mine["l4-too-fast"]["declared_infeasible"]
    assert not mine["chat-small"]["declared_infeasible"] and mine["chat-small"]["configs_to_slo"] is not None
    assert len([r for r in by_name["chat-small"]["results"] if r["strategy"] == "random"]) == 2  # one per seed
    assert "| slotune |" in (out / "tuner.md").read_text()
    assert (out / "tuner.png").stat().st_size > 0
    assert body["machine"]["cores"]


def test_a_near_miss_replica_trim_gets_headroom_then_the_fewer_replicas_hold():
    # On exactly modelled hardware 3 -> 2 replicas misses TTFT P99 by ~35% at max_num_seqs 64, and holds at 128.
    # It starts where the SLO holds at 3 replicas (from the poor start, the sized capacity change picks 128 at once).
    scenario = Scenario.model_validate(PREFIX_HEAVY | {"start": {"maxNumSeqs": 64, "maxNumBatchedTokens": 1024,
                                                                 "enablePrefixCaching": True, "replicas": 3}})
    trace = run_slotune(Evaluator(scenario), budget=12)
    configs = [e.config for e in trace.applied]
    missed = next(i for i, c in enumerate(configs) if c.replicas == 2)
    headroom, retry = configs[missed + 1], configs[missed + 2]
    assert headroom.replicas == 3 and headroom.max_num_seqs > configs[missed].max_num_seqs
    assert retry == headroom.with_changes(replicas=2)
    assert not trace.applied[missed].met and trace.applied[missed + 2].met


def test_hardware_skew_changes_what_is_simulated_but_not_what_the_tuner_is_told():
    plain = Scenario.model_validate(FEASIBLE)
    slow = Scenario.model_validate(FEASIBLE | {"hardwareSkew": {"bandwidth": 0.7, "compute": 0.6, "overhead": 3}})
    assert slow.deployment == plain.deployment and slow.deployment.efficiency is None  # the tuner sees the priors
    prior, skewed = plain.simulated_deployment.step_model(plain.start), slow.simulated_deployment.step_model(slow.start)
    assert skewed.eff.bandwidth == pytest.approx(0.7 * prior.eff.bandwidth)
    assert skewed.eff.step_overhead_s == pytest.approx(3 * prior.eff.step_overhead_s)
    config = plain.start.with_changes(max_num_seqs=64)
    fast_tpot = Evaluator(plain).evaluate(config).snapshot.tpot.p50_ms
    slow_tpot = Evaluator(slow).evaluate(config).snapshot.tpot.p50_ms
    assert slow_tpot > 1.3 * fast_tpot
    with pytest.raises(ValueError, match="bandwidth"):
        Scenario.model_validate(FEASIBLE | {"hardwareSkew": {"bandwidth": 0}})


def test_a_config_meets_the_slo_only_if_every_scored_window_does_and_later_windows_are_fresh():
    from slotune.tunerbench.evaluator import SCORED_WINDOWS

    evaluator = Evaluator(Scenario.model_validate(FEASIBLE))
    config = evaluator.scenario.start.with_changes(max_num_seqs=64, replicas=2)
    evaluation = evaluator.evaluate(config)
    windows = [evaluator.window(config, i) for i in range(SCORED_WINDOWS + 1)]
    assert evaluation.snapshot == windows[0]
    assert windows[1] != windows[0] and windows[2] != windows[1]  # fresh traffic, not a replay
    slo = evaluator.scenario.slo
    assert evaluation.met == all(slo.is_met(w) for w in windows[:SCORED_WINDOWS] if w is not None)
    assert (evaluation.goodput_per_replica > 0) == evaluation.met
    assert evaluation.goodput_per_replica <= evaluator.offered_rate_per_s / config.replicas


def test_a_shifting_scenario_is_scored_on_its_shifted_traffic_and_measured_on_both():
    shifting = Scenario.model_validate(FEASIBLE | {"shift": {"afterWindows": 2, "specAcceptanceRate": 0.2,
                                                             "workload": {"profile": "chat", "requestRatePerS": 60}}})
    evaluator = Evaluator(shifting)
    assert evaluator.scenario.workload.request_rate_per_s == 60 and evaluator.scenario.spec_acceptance_rate == 0.2
    (start, before), (after_windows, final) = evaluator.phases
    assert (start, after_windows) == (0, 2) and final is evaluator
    assert before.scenario.workload.request_rate_per_s == 30
    trace = run_slotune(evaluator, budget=6)
    assert trace.final is not None
    assert 0 <= evaluator.meets_fresh(trace.final) <= 3
    assert [w.phase for w in trace.windows[:3]] == [0, 0, 1]  # two windows of the first traffic, then the shifted


def test_a_load_that_rises_then_falls_is_served_in_three_phases_and_scored_on_the_last():
    rise_fall = Scenario.model_validate(FEASIBLE | {"shift": {
        "afterWindows": 2, "workload": {"profile": "chat", "requestRatePerS": 60},
        "then": {"afterWindows": 3, "workload": {"profile": "chat", "requestRatePerS": 30}}}})
    evaluator = Evaluator(rise_fall)
    assert [start for start, _ in evaluator.phases] == [0, 2, 5]
    assert [p.scenario.workload.request_rate_per_s for _, p in evaluator.phases] == [30, 60, 30]
    assert evaluator.traffic(2)[0] == 0 and evaluator.traffic(3)[0] == 1 and evaluator.traffic(6)[0] == 2
    trace = run_slotune(evaluator, budget=6)
    assert max(w.number for w in trace.windows) > 5 + 4  # served until the fall was seen


def test_a_noisy_machine_varies_only_what_slotune_measures():
    noisy = Scenario.model_validate(FEASIBLE | {"speedNoise": 0.15})
    speeds = [noisy.speed(i) for i in range(1, 41)]
    assert all(0.85 <= s <= 1.15 for s in speeds) and max(speeds) - min(speeds) > 0.2
    assert speeds == [noisy.speed(i) for i in range(1, 41)]  # the same machine on every run
    assert Scenario.model_validate(FEASIBLE).speed(3) == 1.0
    evaluator, config = Evaluator(noisy), noisy.start.with_changes(max_num_seqs=64)
    slow, usual = evaluator.window(config, 0, speed=0.85), evaluator.window(config, 0)
    assert slow is not None and usual is not None and slow != usual
    assert evaluator.evaluate(config).snapshot == usual  # scoring is noise-free
    trace = run_slotune(evaluator, budget=6)
    assert [w.speed for w in trace.windows] == [noisy.speed(w.number) for w in trace.windows]


def test_stochastic_baselines_draw_independently_in_every_scenario():
    # Seed 0 in two scenarios with the same space must not draw the same configs: with one seed shared by every
    # scenario, a lucky first draw counted once per scenario and set the pooled median.
    from slotune.tunerbench.strategies import run_random, run_tpe

    one = Evaluator(Scenario.model_validate(FEASIBLE))
    other = Evaluator(Scenario.model_validate(FEASIBLE | {"name": "chat-small-again"}))
    assert all_configs(one.scenario) == all_configs(other.scenario)
    draws = [[e.config.key() + str(e.config.replicas) for e in run(ev, 4, 0).applied]
             for run in (run_random, run_tpe) for ev in (one, other)]
    assert draws[0] != draws[1] and draws[2] != draws[3]


def test_a_config_applied_again_is_not_counted_as_a_new_one():
    from slotune.tunerbench.strategies import Trace, _EvaluatedDeployment

    evaluator = Evaluator(Scenario.model_validate(FEASIBLE))
    start = evaluator.scenario.start
    more = start.with_changes(max_num_seqs=64)
    backend = _EvaluatedDeployment(evaluator, Trace("slotune"))
    for config in (start, more, start, more, start.with_changes(replicas=2)):  # two rollbacks, one new config
        assert backend.apply(config).ok
    assert [e.config for e in backend.trace.applied] == [more, start.with_changes(replicas=2)]


def test_the_oracle_holds_on_the_fresh_windows_and_random_search_has_an_exact_expectation():
    from slotune.tunerbench.evaluator import LATER_WINDOWS, SCORED_WINDOWS
    from slotune.tunerbench.run import random_search_expected, run_scenario

    result = run_scenario(Scenario.model_validate(FEASIBLE), budget=3, strategies=("grid",), seeds=1)
    evaluator = Evaluator(Scenario.model_validate(FEASIBLE))
    held = [c for c in all_configs(evaluator.scenario) if evaluator.holds(c)]
    assert result.feasible == bool(held)
    later = range(SCORED_WINDOWS, SCORED_WINDOWS + LATER_WINDOWS)
    assert all(evaluator.evaluate(c).met and evaluator.meets_fresh(c) == 3 for c in held)
    assert all(evaluator.scenario.slo.is_met(evaluator.window(c, i)) for c in held for i in later)
    assert result.oracle_config in {c.describe() for c in held}
    assert result.space_size == 6
    assert result.space_met == sum(evaluator.evaluate(c).met for c in all_configs(evaluator.scenario)) >= len(held)
    # 4 configs, 1 meets: the first draw hits it with 1/4, the second 3/4 * 1/3, ...; budget 2: never = 1/2.
    assert random_search_expected(4, 1, 2) == [0.25, 0.25, 0.5]
    assert abs(sum(random_search_expected(20, 3, 12)) - 1.0) < 1e-12


def test_an_overload_is_called_infeasible_within_two_changes_of_the_evidence():
    overload = Scenario.model_validate(FEASIBLE | {
        "name": "l4-overload", "accelerator": "nvidia-l4", "workload": {"profile": "chat", "requestRatePerS": 150},
        "slo": {"ttft": {"p99": 3000}, "tpot": {"p99": 100}}, "tuning": {"bounds": {"maxReplicas": 4}}})
    trace = run_slotune(Evaluator(overload), budget=12)
    assert trace.declared_infeasible and trace.evidence is not None and "replicas" in trace.evidence
    assert trace.changes_at_evidence == 0  # the first window already said so
    assert trace.changes_to_infeasible is not None and trace.changes_to_infeasible - trace.changes_at_evidence <= 2


def test_fresh_windows_are_drawn_per_scenario_and_never_measured():
    # The same fresh seeds in every scenario drew the same arrival and length quantiles everywhere: one window with
    # a prompt 7x the median decided the fresh verdict of every scenario at once.
    from slotune.tunerbench.evaluator import FRESH_SEED_OFFSET, FRESH_SEEDS

    one = Evaluator(Scenario.model_validate(FEASIBLE))
    other = Evaluator(Scenario.model_validate(FEASIBLE | {"name": "chat-small-again"}))
    mine, theirs = ([e.fresh_index(i) for i in range(FRESH_SEEDS)] for e in (one, other))
    assert set(mine).isdisjoint(theirs) and len(set(mine)) == FRESH_SEEDS
    assert min(mine + theirs) >= FRESH_SEED_OFFSET  # past every window a strategy measures
    config = one.scenario.start.with_changes(max_num_seqs=64, replicas=2)
    windows = [one.window(config, i) for i in mine]
    assert one.meets_fresh(config) == sum(one.scenario.slo.is_met(w) for w in windows if w is not None)


def test_configs_at_the_slos_edge_are_not_converged_on():
    """The benchmark's two marginal cases, on their scenario files. chat-h100-interactive: 3 replicas met the scored
    windows and converged at 80% on windows that disagreed (P99 441 / 397 / 248 ms vs 500), then missed a fresh
    window at 559 ms; the next window predicted at 90%, after up to 4 windows, asks for the 4th replica, which holds.
    summarization-a100-relaxed: its best config misses 3 of 15 windows (TTFT P99 1,216-3,081 ms vs 2,000), so
    nothing holds (the oracle's bar); it converged on two lucky windows and now is called Infeasible."""
    from pathlib import Path

    from slotune.tunerbench.evaluator import FRESH_SEEDS

    found = {s.name: s for s in load_scenarios(Path(__file__).parents[3] / "bench" / "scenarios")}
    chat = Evaluator(found["chat-h100-interactive"])
    trace = run_slotune(chat, budget=12)
    assert not trace.declared_infeasible and trace.final is not None
    assert chat.evaluate(trace.final).met and chat.meets_fresh(trace.final) == FRESH_SEEDS
    summarization = Evaluator(found["summarization-a100-relaxed"])
    assert run_slotune(summarization, budget=12).declared_infeasible
