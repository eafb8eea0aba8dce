"""The README's benchmark numbers are exactly what bench/readme_numbers.py renders from the committed results, and
`make bench` reruns every benchmark with the parameters those results record (so its rerun is the same experiment)."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import readme_numbers
from bench.readme_demo import demo_table
from bench.readme_format import load
from bench.readme_numbers import README, RESULTS, RegionError, render_regions, rewrite

ROOT = README.parent


def test_committed_readme_is_what_the_committed_results_render() -> None:
    current = README.read_text()
    assert rewrite(current, render_regions(RESULTS)) == current, "README.md is stale: run `make readme-numbers`"


def _copy_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    for path in RESULTS.glob("*.json"):
        shutil.copyfile(path, results / path.name)
    return results


def _engine_ratio(body: dict[str, Any]) -> None:
    next(r for r in body["engine"] if r["concurrency"] == 32)["ratio_to_batch1"] = 7.5


def _tuner_median(body: dict[str, Any]) -> None:
    next(s for s in body["summary"] if s["strategy"] == "slotune")["configs_to_slo_median"] = 4.5


def _simulator_error(body: dict[str, Any]) -> None:
    body["cases"][0]["ttft_p50"]["predicted_ms"] = body["cases"][0]["ttft_p50"]["measured_ms"] * 3


def _demo_elapsed(body: dict[str, Any]) -> None:
    body["elapsed_s"] = 4321.0


def _real_model_fraction(body: dict[str, Any]) -> None:
    body["engine_fraction_of_bound"] = 0.07


def _traces_hindsight(body: dict[str, Any]) -> None:
    body["traces"][0]["hindsight"] = {
        "default": {"reached": True, "attainment": 0.99991, "gpu_hours": 0.777},
        "oracle": {"reached": False, "attainment": 0.98, "gpu_hours": 0.5}}  # short of its bar: not the yardstick


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("engine", _engine_ratio, "**7.50x** (target >= 6x)"),
    ("tuner", _tuner_median, "slotune **4.5 / "),
    ("simulator_validation", _simulator_error, "TTFT P50, 200% high"),
    ("demo", _demo_elapsed, "The whole run took 4321 s"),
    ("real_model", _real_model_fraction, "tokens/s = 7%** of the bound"),
    ("traces", _traces_hindsight, "*hindsight pool (default): a yardstick, arrivals known ahead, no start-up* | "
                                  "99.99% (one pass) | 0.78 (one pass) |"),
])
def test_a_changed_result_changes_the_readme(tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None],
                                             expected: str) -> None:
    results = _copy_results(tmp_path)
    body = json.loads((results / f"{name}.json").read_text())
    change(body)
    (results / f"{name}.json").write_text(json.dumps(body))
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    assert readme_numbers.main(["--results", str(results), "--readme", str(readme), "--check"]) == 1
    assert readme_numbers.main(["--results", str(results), "--readme", str(readme)]) == 0
    assert expected in readme.read_text()
    assert expected not in README.read_text()


def test_the_demo_table_is_the_one_in_the_runs_own_report() -> None:
    """The README renders the demo table from report.json; the run's report.md (kept as demo.md) printed the same."""
    table = demo_table(load(RESULTS, "demo")).strip()
    assert table in (RESULTS / "demo.md").read_text()


def test_a_missing_region_is_refused() -> None:
    readme = README.read_text()
    start, end = readme.index("<!-- bench:demo-table -->"), readme.index("<!-- /bench:demo-table -->")
    without = readme[:start] + readme[end + len("<!-- /bench:demo-table -->"):]
    with pytest.raises(RegionError, match="demo-table"):
        rewrite(without, render_regions(RESULTS))


def test_an_unknown_region_is_refused() -> None:
    with pytest.raises(RegionError, match="typed"):
        rewrite(README.read_text() + "<!-- bench:typed -->12x<!-- /bench:typed -->\n", render_regions(RESULTS))


def _argument_defaults(script: Path) -> dict[str, object]:
    """`--flag` -> its argparse default, read from the source: importing the benchmarks would import torch."""
    defaults: dict[str, object] = {}
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flag = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(flag, str) and isinstance(default, ast.Constant):
                defaults[flag] = default.value
    return defaults


def _constant(script: Path, name: str) -> object:
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{script} defines no {name}")


def _result(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def test_benchmark_defaults_are_the_parameters_of_the_committed_results() -> None:
    engine, quant, server, spec = _result("engine"), _result("quant"), _result("server"), _result("speculative")
    tuner, demo, validation = _result("tuner"), _result("demo"), _result("simulator_validation")
    expected = {
        "bench/bench_engine.py": {"--rounds": engine["setup"]["rounds"], "--max-tokens": engine["setup"]["max_tokens"],
                                  "--threads": engine["machine"]["torch_threads"]},
        "bench/bench_quant.py": {"--rounds": quant["rounds"], "--max-tokens": quant["max_tokens"],
                                 "--threads": quant["machine"]["torch_threads"],
                                 "--presets": ",".join(dict.fromkeys(r["preset"] for r in quant["summary"]))},
        "bench/bench_server.py": {"--rounds": server["rounds"], "--max-tokens": server["max_tokens"],
                                  "--streams": server["streams"]},
        "bench/bench_speculative.py": {"--rounds": spec["rounds"], "--max-tokens": spec["max_tokens"],
                                       "--threads": spec["machine"]["torch_threads"]},
        "bench/bench_demo.py": {"--example": demo["example"]},
        "operator/slotune/tunerbench/command.py": {"--budget": tuner["budget"],
                                                   "--seeds": tuner["seeds_per_stochastic_baseline"]},
    }
    for script, parameters in expected.items():
        defaults = _argument_defaults(ROOT / script)
        assert {flag: defaults.get(flag) for flag in parameters} == parameters, script
    runs = {len(case["ttft_p50"]["measured_runs_ms"]) for case in validation["cases"]}
    assert runs == {_constant(ROOT / "bench/validate_simulator.py", "REPEATS")}
    scale, script = _result("operator_scale"), ROOT / "bench/bench_operator_scale.py"
    assert tuple(scale["counts"]) == _constant(script, "COUNTS")
    assert scale["window_s"] == _constant(script, "WINDOW_S")
    real, script = _result("real_model"), ROOT / "bench/bench_real_model.py"
    setup = real["setup"]
    assert {flag: _argument_defaults(script).get(flag) for flag in
            ("--rounds", "--max-tokens", "--stream-tokens", "--quality-tokens", "--threads")} == {
        "--rounds": setup["rounds"], "--max-tokens": setup["max_tokens"], "--stream-tokens": setup["stream_tokens"],
        "--quality-tokens": setup["quality_tokens"], "--threads": real["machine"]["torch_threads"]}
    assert (tuple(setup["streams"]), setup["speculative_config"]) == (_constant(script, "STREAMS"),
                                                                       _constant(script, "SPEC_CONFIG"))
