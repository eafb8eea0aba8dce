"""The README's rows for the tuner benchmark: configurations to the SLO, infeasibility, fresh traffic, goodput, the
honesty figures, and where slotune ends below the near-oracle bar."""

from __future__ import annotations

from bench.readme_format import Result, count, row

# The tuner benchmark's bar for "near the oracle" (tunerbench: configs until one within 95% of its goodput).
NEAR_ORACLE = 0.95


def tuner_rows(tuner: Result) -> list[str]:
    by = {s["strategy"]: s for s in tuner["summary"]}
    ours, others = by["slotune"], [s for name, s in by.items() if name != "slotune"]
    scenarios = tuner["scenarios"]
    num_feasible = sum(1 for s in scenarios if s["feasible"])

    def spread(s: Result, key: str, stats: tuple[str, ...]) -> str:
        return " / ".join(f"{s[f'{key}_{stat}']:.1f}" if stat == "mean" else count(s[f"{key}_{stat}"])
                          for stat in stats)

    def versus(key: str, stats: tuple[str, ...]) -> str:
        return f"slotune **{spread(ours, key, stats)}**; " + "; ".join(
            f"{_name(s['strategy'])} {spread(s, key, stats)}" for s in others)

    expected = tuner.get("random_expected")
    exact = "" if not expected else (f"; uniform random search in exact expectation {count(expected['median'])} / "
                                     f"{count(expected['p90'])} / {expected['mean']:.1f}")
    fresh = [r["fresh_met"] for s in scenarios if s["feasible"] for r in s["results"]
             if r["strategy"] == "slotune" and r.get("fresh_met") is not None]
    held = sum(f == 3 for f in fresh)
    on_evidence = ours.get("infeasible_on_evidence", 0)
    within = ours.get("infeasible_within_bound_of_evidence", 0)
    most = ours.get("changes_after_evidence_max")
    # Called with no such window before: the changes each took, so the README shows how long "the rest" took.
    rest = sorted(r["changes_to_infeasible"] for s in scenarios if not s["feasible"] for r in s["results"]
                  if r["strategy"] == "slotune" and r["declared_infeasible"] and r.get("changes_at_evidence") is None
                  and r.get("changes_to_infeasible") is not None)
    recognised = f"{ours['infeasible_recognised']}/{ours['infeasible_total']}"
    wrongly = "none" if ours["false_infeasible"] == 0 else str(ours["false_infeasible"])
    goodput = ", ".join(f"{_name(s['strategy'])} {s['goodput_ratio_mean']:.2f}" for s in others)
    return [
        row(f"tuner, {len(scenarios)} simulated scenarios ({num_feasible} feasible; hardware skewed from the tuner's "
             "model; a config counts only if it meets the SLO on every scored window of traffic), configs applied "
             "until the SLO holds, median / p90 / mean", versus("configs_to_slo", ("median", "p90", "mean")) + exact,
             "tuner.md"),
        row(f"tuner, configs until one within {NEAR_ORACLE:.0%} of the oracle's goodput, median / p90 "
             f"(budget {tuner['budget']}; {tuner['budget'] + 1} = never)",
             versus("configs_to_near_oracle", ("median", "p90")), "tuner.md"),
        row("tuner, infeasible scenarios recognised",
             f"slotune **{recognised}**, {wrongly} wrongly; baselines cannot tell", "tuner.md"),
        row("tuner, infeasible called within 2 changes of the first window whose evidence sufficed (the model: a "
             "target below every allowed floor, or a load far beyond maxReplicas; measured at the roomiest allowed "
             "config: TTFT and TPOT both missed, or one missed by more than the other's room with the load beyond "
             "maxReplicas)",
             f"slotune **{within} of {on_evidence}**"
             + ("" if most is None else f", at most {most} change{'' if most == 1 else 's'} after it")
             + f"; {ours['infeasible_recognised'] - on_evidence} more called once the remedies left were tried"
             + ("" if not rest else f" (after {', '.join(map(str, rest))} changes)"), "tuner.md"),
        row("tuner, slotune's final config meets the SLO on 3 fresh windows of traffic no strategy measured",
             f"**{held} of {len(fresh)}** feasible scenarios ({sum(fresh)} of {3 * len(fresh)} windows)", "tuner.md"),
        row("tuner, final goodput / exhaustive oracle, median / mean",
             f"slotune **{ours['goodput_ratio_median']:.2f} / {ours['goodput_ratio_mean']:.2f}**; {goodput} (mean)",
             "tuner.md"),
    ]


def tuner_honesty_rows(tuner: Result) -> list[str]:
    """slotune's decisions judged noise-free (tunerbench.honesty_report), over every scenario; none in older files."""
    total = next((f for f in tuner.get("honesty", []) if f["family"] == "all"), None)
    if total is None:
        return []
    above, unneeded = total["above_oracle"], total["unneeded_output_changes"]
    return [row(
        "tuner, slotune's decisions judged noise-free (noisy machines vary only what it measures): false keeps, "
        "false rollbacks, scenarios resting on more GPUs than the oracle, output-altering changes the SLO did not "
        "need, windows missed because of a trim",
        f"**{total['false_keeps']} of {total['keeps']}** keeps; **{total['false_rollbacks']} of "
        f"{total['changes_judged']}** changes; **{len(above)}** of {total['scenarios']}"
        + (f" ({', '.join(above)})" if above else "") + f"; **{len(unneeded)}**"
        + (f" ({', '.join(unneeded)})" if unneeded else "")
        + f"; **{total['windows_missed_after_trim']}** of {total['windows_measured']} windows", "tuner.md")]


def tuner_shortfall(tuner: Result) -> str:
    """The feasible scenarios where slotune ends below the near-oracle bar, each with both configurations."""
    short = [(s, r) for s in tuner["scenarios"] if s["feasible"] for r in s["results"]
             if r["strategy"] == "slotune" and (r["final_goodput_ratio"] or 0.0) < NEAR_ORACLE]
    num_feasible = sum(1 for s in tuner["scenarios"] if s["feasible"])
    if not short:
        return (f"On the tuner benchmark slotune's final goodput is within {NEAR_ORACLE:.0%} of the oracle's on every "
                f"feasible scenario ({num_feasible}).")
    cases = "; ".join(f"{s['scenario']}, {r['final_goodput_ratio'] or 0.0:.2f}: the oracle runs "
                      f"`{s['oracle_config']}`, slotune stops at `{r['final_config']}`" for s, r in short)
    return (f"On the tuner benchmark slotune's final goodput is below {NEAR_ORACLE:.0%} of the oracle's on "
            f"{len(short)} of {num_feasible} feasible scenarios ({cases}).")


def _name(strategy: str) -> str:
    return {"tpe": "Optuna TPE"}.get(strategy, strategy)
