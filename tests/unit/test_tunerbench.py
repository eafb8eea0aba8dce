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
    scenario = Scenario.model_validate(PREFIX_HEAVY)
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
    assert evaluator.before is not None and evaluator.before.scenario.workload.request_rate_per_s == 30
    trace = run_slotune(evaluator, budget=6)
    assert trace.final is not None
    assert 0 <= evaluator.meets_fresh(trace.final) <= 3
