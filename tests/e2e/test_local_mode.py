"""`slotune tune` end to end on this machine: real runtime processes, real load, the shared tuning loop."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SLOTUNE = [sys.executable, "-m", "slotune.cli"]


def scenario(tmp_path: Path, name: str, **changes: object) -> Path:
    """A small version of examples/local-tiny.yaml: short windows, so a run takes tens of seconds."""
    body = yaml.safe_load((ROOT / "examples" / "local-tiny.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["tuning"] |= {"windowSeconds": 8, "minSamples": 15, "warmupSeconds": 0, "maxIterations": 4}
    # Loose targets: these tests are about the loop, and a shared 2-core machine makes tails noisy (at a load average
    # of 12 on 2 cores a run against a 100 ms TPOT P99 ended Infeasible). TTFT stays where the poor start misses it.
    body["spec"]["slo"] = {"ttft": {"p99": 1000}, "tpot": {"p99": 250}}
    # The example's closed loop makes the poor start poor on any machine: one sequence at a time, each request first
    # waits for the 15 others, ~2,000 decode steps (2.6 s at the 1.3 ms steps seen here), against one or two steps
    # once they share a batch. An open-loop 4 requests/s met this TTFT target at maxNumSeqs 1 in a CI run.
    assert body["spec"]["workload"]["arrival"] == "concurrency"
    for section, value in changes.items():
        merged = body["spec"].get(section, {}) | value if isinstance(value, dict) else value
        body["spec"][section] = merged
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


# A run is stuck, not slow, when its run directory has not changed for this long: the state file and report are
# rewritten after every window, and a window (8 s here) plus a restart take far less even on a loaded machine.
STALL_S = 300


def tune(path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run `slotune tune` to its end, however long a loaded machine makes it, as long as it makes progress."""
    with subprocess.Popen([*SLOTUNE, "tune", str(path), "--out", str(out), "--no-live", *extra], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        streams = ThreadPoolExecutor(2)  # drained while the run lasts, so a full pipe never blocks it
        stdout, stderr = streams.submit(process.stdout.read), streams.submit(process.stderr.read)
        last_change = (0.0, time.monotonic())
        while process.poll() is None:
            changed = max((f.stat().st_mtime for f in out.glob("*") if f.is_file()), default=0.0)
            if changed != last_change[0]:
                last_change = (changed, time.monotonic())
            if time.monotonic() - last_change[1] > STALL_S:
                kill_run(process, out)
                pytest.fail(f"no progress in {out} for {STALL_S} s")
            time.sleep(0.5)
        streams.shutdown()
        return subprocess.CompletedProcess(process.args, process.returncode, stdout.result(), stderr.result())


def runtime_pids(marker: str) -> list[int]:
    """Live processes whose command line mentions `marker` (the run directory), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if marker in cmdline and "gpu_runtime" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def kill_run(process: subprocess.Popen, out: Path) -> None:
    """A failing test's last resort: SIGKILL gives the run no chance to stop its runtimes (their own sessions), so
    they are killed here too; a failed test leaves no process behind."""
    process.kill()
    process.wait()
    for pid in runtime_pids(str(out)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_poor_start_converges_and_leaves_a_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = tune(scenario(tmp_path, "converge"), out)
    assert result.returncode == 0, result.stdout + result.stderr
    status = report(out)["status"]
    assert status["phase"] == "Converged", (status["message"], status["history"])
    kept = [h for h in status["history"] if h["verdict"] == "Kept"]
    assert kept, status["history"]
    first = status["history"][0]
    assert first["before"]["ttft"]["p99"] > 1000, "the poor start must have missed the TTFT target"
    assert status["observed"]["ttft"]["p99"] <= 1000 and status["observed"]["tpot"]["p99"] <= 250
    assert status["config"]["maxNumSeqs"] > 1
    with Image.open(out / "slo.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 500
    markdown = (out / "report.md").read_text()
    assert "Converged" in markdown and "baseline" in markdown and "max_num_seqs 1 ->" in markdown
    assert runtime_pids(str(out)) == []


def test_out_of_reach_slo_ends_infeasible_naming_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = scenario(tmp_path, "infeasible", slo={"tpot": {"p99": 0.05}},
                    runtime={"engine": "builtin", "config": {"maxNumSeqs": 16, "maxNumBatchedTokens": 512}})
    result = tune(path, out)
    assert result.returncode == 0, result.stdout + result.stderr
    status = report(out)["status"]
    assert status["phase"] == "Infeasible"
    assert "bandwidth" in status["message"] and "accelerator" in status["message"]
    assert "needs:" in result.stdout
    assert runtime_pids(str(out)) == []


def _serving_load(out: Path) -> bool:
    """Whether the first window's requests reach the runtimes: every runtime (port in its log's name) has tokens."""
    ports = [log.stem.rsplit("-", 1)[1] for log in (out / "logs").glob("runtime-*.log")]
    try:
        texts = [httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text for port in ports]
    except httpx.HTTPError:
        return False
    return bool(texts) and all(re.search(r"^vllm:prompt_tokens_total\{[^}]*\} [1-9]", t, re.M) for t in texts)


def test_ctrl_c_mid_run_leaves_no_runtime_behind(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = scenario(tmp_path, "interrupted", replicas=2, tuning={"windowSeconds": 30})
    started = time.monotonic()
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: as a user's terminal would,
    # the run gets SIGINT's default however this pytest was started (`make test &` ignored every Ctrl-C below).
    process = subprocess.Popen([*SLOTUNE, "tune", str(path), "--out", str(out), "--no-live"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Progress, not a clock: the runtimes started and the first window's load reaches both.
        while not (len(runtime_pids(str(out))) == 2 and _serving_load(out)):
            assert process.poll() is None, process.stdout.read()
            time.sleep(0.5)
        startup_s = time.monotonic() - started
        os.kill(process.pid, signal.SIGINT)
        interrupted = time.monotonic()
        # Stopping does a fraction of starting's work (imports, two runtimes loading a model), and a loaded machine
        # slows both alike: the bound is 10 s, or the measured startup where the machine is slower than that.
        budget_s = max(10.0, startup_s)
        output, _ = process.communicate(timeout=budget_s)
        stop_s = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            kill_run(process, out)
    assert process.returncode == 130, output
    assert "interrupted" in output
    assert runtime_pids(str(out)) == []
    assert (out / "report.json").exists() and (out / "slo.png").exists(), "an interrupted run reports where it stood"
    assert stop_s <= budget_s, (stop_s, startup_s)


@pytest.mark.parametrize("problem, message", [
    ("spec: {}\n", "spec.model"),
    ("not: [valid", "<yaml>"),
])
def test_bad_file_is_refused_with_the_field_named(tmp_path: Path, problem: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: slotune.io/v1alpha1\nkind: TunedModel\nmetadata: {name: bad}\n" + problem
                    if problem.startswith("spec") else problem)
    result = tune(path, tmp_path / "run")
    assert result.returncode == 2
    assert message in result.stdout
