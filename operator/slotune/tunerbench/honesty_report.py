"""The tuner benchmark's honesty section: slotune's decisions judged noise-free (tunerbench.honesty), per scenario
family and in all, with the issue's bars beside them.

A family is the scenario name's prefix for the classes the honesty metrics were made for (noisy machines, chunked
prefill off at the start, draft acceptance far above the prior, a load that rises then falls); every other scenario is
"other".
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.tunerbench.run import ScenarioResult

FAMILIES = ("noisy", "chunking-off", "acceptance-high", "rise-fall")
MAX_FALSE_ROLLBACK_SHARE = 0.05  # of the changes judged (kept or rolled back)


@dataclass(frozen=True)
class FamilyHonesty:
    family: str
    scenarios: int
    feasible: int
    reached_slo: int  # of the feasible ones
    false_infeasible: int
    changes_judged: int  # kept or rolled back
    keeps: int
    false_keeps: int
    rollbacks: int
    false_rollbacks: int
    gpus_at_rest: int  # slotune's final configs, summed
    gpus_oracle: int  # the oracles', summed
    above_oracle: tuple[str, ...]  # scenarios where slotune rests on more GPUs than the oracle
    unneeded_output_changes: tuple[str, ...]  # "scenario: knob"
    windows_measured: int
    windows_missed_after_trim: int
    false_rollbacks_held: int  # rolled back a config that holds the SLO (the rest: a step short of it)
    feasible_changes_judged: int  # on the scenarios the oracle finds feasible
    feasible_false_rollbacks: int


def family_of(scenario: str) -> str:
    return next((f for f in FAMILIES if scenario.startswith(f"{f}-")), "other")


def summarise_honesty(results: list[ScenarioResult]) -> list[FamilyHonesty]:
    """One row per family present (in FAMILIES order, then other), then "all"."""
    groups = {f: [r for r in results if family_of(r.scenario) == f] for f in (*FAMILIES, "other")}
    rows = [_row(f, group) for f, group in groups.items() if group]
    return [*rows, _row("all", results)]


def _row(family: str, results: list[ScenarioResult]) -> FamilyHonesty:
    pairs = [(r, mine) for r in results if (mine := r.slotune) is not None and mine.honesty is not None]
    judged = [mine.honesty for _, mine in pairs if mine.honesty is not None]
    return FamilyHonesty(
        family, len(pairs), sum(r.feasible for r, _ in pairs),
        sum(r.feasible and mine.configs_to_slo is not None for r, mine in pairs),
        sum(r.feasible and mine.declared_infeasible for r, mine in pairs),
        sum(h.keeps + h.rollbacks for h in judged), sum(h.keeps for h in judged), sum(h.false_keeps for h in judged),
        sum(h.rollbacks for h in judged), sum(h.false_rollbacks for h in judged),
        sum(h.gpus_at_rest or 0 for h in judged), sum(r.oracle_gpus for r, _ in pairs),
        tuple(r.scenario for r, mine in pairs if mine.honesty and (mine.honesty.gpus_at_rest or 0) > r.oracle_gpus),
        tuple(f"{r.scenario}: {knob}" for r, mine in pairs if mine.honesty
              for knob in mine.honesty.unneeded_output_changes),
        sum(h.windows_measured for h in judged), sum(h.windows_missed_after_trim for h in judged),
        sum(h.false_rollbacks_held for h in judged),
        sum(mine.honesty.keeps + mine.honesty.rollbacks for r, mine in pairs if r.feasible and mine.honesty),
        sum(mine.honesty.false_rollbacks for r, mine in pairs if r.feasible and mine.honesty))


def honesty_lines(results: list[ScenarioResult]) -> list[str]:
    rows = summarise_honesty(results)
    if len(rows) < 2:
        return []
    lines = ["## Honesty (slotune's decisions judged noise-free)", "",
             "A keep is false when the change kept did not do, noise-free on the traffic that judged it, what it was "
             "made for (a fix: its config stands better than the one before, by SLO, goodput per replica, then margin; "
             "a trim: its config still holds); a rollback is false when the change rolled back did. A missed window "
             "counts against a trim when the config before the trim meets that same window (same traffic, same "
             "machine speed). An output-altering change (`quality.alters_outputs`: quantized weights, an fp8 KV cache, "
             "speculation) is unneeded when the final config with that knob back at the start's value holds the SLO. "
             "Noisy scenarios vary only what slotune measures (speed drawn from 1 +- speedNoise per window); the "
             "search baselines, the oracle and every judgement here are noise-free "
             "(`operator/slotune/tunerbench/honesty.py`).", "",
             "| family | scenarios | feasible reached SLO | false infeasible | changes judged | false keeps | "
             "false rollbacks (of a config that holds) | GPUs at rest / oracle's | above the oracle | "
             "unneeded output-altering | windows missed after a trim / measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in rows:
        lines.append(f"| {f.family} | {f.scenarios} | {f.reached_slo}/{f.feasible} | {f.false_infeasible} | "
                     f"{f.changes_judged} | {f.false_keeps}/{f.keeps} | "
                     f"{f.false_rollbacks}/{f.rollbacks} ({f.false_rollbacks_held}) | "
                     f"{f.gpus_at_rest}/{f.gpus_oracle} | {', '.join(f.above_oracle) or '-'} | "
                     f"{', '.join(f.unneeded_output_changes) or '-'} | "
                     f"{f.windows_missed_after_trim}/{f.windows_measured} |")
    why = {r.scenario: mine.above_oracle for r in results if (mine := r.slotune) is not None}
    return [*lines, "", *_bar_lines(rows[-1], why)]


def _why(scenario: str, why: dict[str, str]) -> str:
    return f"{scenario} ({why[scenario]})" if why.get(scenario) else scenario


def _bar_lines(total: FamilyHonesty, why_above: dict[str, str]) -> list[str]:
    share = total.false_rollbacks / total.changes_judged if total.changes_judged else 0.0
    feasible = total.feasible_false_rollbacks / total.feasible_changes_judged if total.feasible_changes_judged else 0.0

    def verdict(ok: bool) -> str:
        return "holds" if ok else "FAILS"

    above = "; ".join(_why(name, why_above) for name in total.above_oracle) or "none"

    return [
        "The issue's bars, over every scenario:", "",
        f"- every feasible scenario reaches its SLO: {verdict(total.reached_slo == total.feasible)} "
        f"({total.reached_slo} of {total.feasible});",
        f"- none feasible called Infeasible: {verdict(total.false_infeasible == 0)} ({total.false_infeasible});",
        f"- GPUs at rest <= the oracle's on every scenario: {verdict(not total.above_oracle)} "
        f"({len(total.above_oracle)} above: {above});",
        f"- false rollbacks <= {MAX_FALSE_ROLLBACK_SHARE:.0%} of changes: "
        f"{verdict(share <= MAX_FALSE_ROLLBACK_SHARE)} ({total.false_rollbacks} of {total.changes_judged}, "
        f"{share:.1%}; on the feasible scenarios {verdict(feasible <= MAX_FALSE_ROLLBACK_SHARE)}: "
        f"{total.feasible_false_rollbacks} of {total.feasible_changes_judged}, {feasible:.1%}); "
        f"{total.false_rollbacks_held} of the {total.false_rollbacks} undid a config that holds the SLO, the rest a "
        "change that narrowed a miss without closing it;",
        f"- no output-altering change kept that the SLO did not need: {verdict(not total.unneeded_output_changes)} "
        f"({', '.join(total.unneeded_output_changes) or 'none'});",
        f"- windows missed because of a trim: {total.windows_missed_after_trim} of {total.windows_measured} measured "
        f"(false keeps: {total.false_keeps} of {total.keeps}).",
    ]


def scenario_honesty_lines(results: list[ScenarioResult]) -> list[str]:
    """Per scenario: slotune's judged decisions, GPUs against the oracle's, unneeded output changes, trim misses."""
    lines = ["## Honesty per scenario", "",
             "| scenario | family | false keeps / keeps | false rollbacks / rollbacks | GPUs at rest | oracle's | "
             "unneeded output-altering | windows missed after a trim / measured |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        mine = r.slotune
        h = mine.honesty if mine is not None else None
        if h is None:
            continue
        lines.append(f"| {r.scenario} | {family_of(r.scenario)} | {h.false_keeps}/{h.keeps} | "
                     f"{h.false_rollbacks}/{h.rollbacks} | {'-' if h.gpus_at_rest is None else h.gpus_at_rest} | "
                     f"{r.oracle_gpus} | {', '.join(h.unneeded_output_changes) or '-'} | "
                     f"{h.windows_missed_after_trim}/{h.windows_measured} |")
    return lines
