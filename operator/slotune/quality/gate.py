"""The quality gate the tuning loop consults around a change that can alter the model's outputs.

`QualityProbe` is what the `Tuner` calls (as it calls a backend and a measurement source): `before` while the
previous config still serves, `check` once the candidate serves. `QualityGate` implements it against any engine's
OpenAI endpoint: it records the probe set's answers on the running config (the reference) before the change is
applied, records them again on the candidate, compares (`compare.py`) and holds the result to `spec.quality`.
It fails closed: a change whose quality could not be measured (a failed probe request, a reference lost to a
restart of the process) is not kept. References can be kept in a directory, so a resumed local run still has them.
A recording takes a probe set's worth of requests (16-32 s for SmolLM2 on a busy CPU): local mode records in the
call, the operator in the background (`in_background`), so a tick never waits on it; until a recording is done,
`before` answers False and `check` a pending verdict, and the loop asks again on a later step.

A canary (slotune.loop.canary) runs the candidate on one pod while its siblings keep the previous config, so the
Service would mix both configs' answers: `check` is then given the canary pod's endpoint (`on`) and probes it
alone. Its reference is the one recorded before the change, or, when that was lost (an operator restarted
mid-canary), a recording of the sibling pods, which still run the previous config.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slotune.api.quality import QualitySpec
from slotune.knobs import KVCacheDtype, Quantization, RuntimeConfig
from slotune.quality.compare import QualityMeasurement, compare
from slotune.quality.probe_set import PROBE_SET_VERSION
from slotune.quality.record import QualityRecord, RecordFailed, record


@dataclass(frozen=True)
class QualityVerdict:
    keep: bool
    reason: str  # the numbers against their bounds, or why nothing could be measured
    measurement: QualityMeasurement | None = None
    pending: bool = False  # the candidate's probe run is still going: no verdict yet


PENDING = QualityVerdict(False, "the quality probe of the candidate is still running", pending=True)


class QualityProbe(Protocol):
    def before(self, previous: RuntimeConfig, config: RuntimeConfig) -> bool:
        """Called while `previous` serves, before `config` is applied: record what the gate needs to judge it.
        False while that recording runs (ask again later); True once done, or when nothing is needed."""
        ...

    def check(self, previous: RuntimeConfig, config: RuntimeConfig, on: str | None = None) -> QualityVerdict | None:
        """Called while `config` serves: the verdict on its outputs (`pending` while it is being measured), or None
        for a change that cannot alter them. `on`: the OpenAI endpoint of the one pod that runs `config` (a canary;
        the others run `previous`), else every endpoint serves it."""
        ...


def alters_outputs(previous: RuntimeConfig, config: RuntimeConfig) -> bool:
    """A move away from the model's own outputs: quantizing weights, an fp8 KV cache, or speculation turned on or
    changed. Speculation is lossless in principle, which is why allowQualityChange does not forbid it; the gate
    checks that the engine keeps it so (verification in another batch shape, another kernel) on the greedy path."""
    return ((config.quantization is not Quantization.NONE and config.quantization != previous.quantization)
            or (config.kv_cache_dtype is not KVCacheDtype.AUTO and config.kv_cache_dtype != previous.kv_cache_dtype)
            or (config.speculative is not None and config.speculative != previous.speculative))


@dataclass(frozen=True)
class QualityCheck:
    """One judged change, for reports: from which config to which, and what was measured."""

    previous: RuntimeConfig
    config: RuntimeConfig
    verdict: QualityVerdict


Recorder = Callable[[Sequence[str], str, int], QualityRecord]
Submit = Callable[[Callable[[], QualityRecord]], "Future[QualityRecord]"]


def inline(work: Callable[[], QualityRecord]) -> Future[QualityRecord]:
    """Run a recording in the caller (local mode: its loop may take a step as long as it likes)."""
    return _run_into(work, Future())


def in_background(work: Callable[[], QualityRecord]) -> Future[QualityRecord]:
    """Run a recording on a thread of its own (the operator: a tick must not wait for it). Daemon threads: a
    recording cut short by the operator stopping is lost, and the change it was for fails closed after a restart."""
    future: Future[QualityRecord] = Future()
    threading.Thread(target=_run_into, args=(work, future), name="quality-probe", daemon=True).start()
    return future


def _run_into(work: Callable[[], QualityRecord], future: Future[QualityRecord]) -> Future[QualityRecord]:
    try:
        future.set_result(work())
    except BaseException as error:  # handed to whoever reads the future
        future.set_exception(error)
    return future


class QualityGate:
    """A `QualityProbe` over the OpenAI endpoints `urls()` returns (the replicas serving now)."""

    def __init__(self, spec: QualitySpec, urls: Callable[[], Sequence[str]], model: str,
                 store_dir: Path | None = None, recorder: Recorder = record, submit: Submit = inline,
                 clock: Callable[[], float] = time.time) -> None:
        self.spec, self.urls, self.model, self.store_dir, self.recorder = spec, urls, model, store_dir, recorder
        self._submit, self._clock = submit, clock
        # When the last probe run ended (`clock`): a latency window must start after it (controller.measure), or the
        # probe set's prompts would be measured as the workload's.
        self.probed_until_s = float("-inf")
        self._running: dict[tuple[str, ...], Future[QualityRecord]] = {}  # recordings under way, by what they are for
        self._references: dict[str, QualityRecord | str] = {}  # config key -> record, or why none was taken
        self._verdicts: dict[tuple[str, str], QualityVerdict] = {}
        self.checks: list[QualityCheck] = []  # every verdict given, oldest first

    def before(self, previous: RuntimeConfig, config: RuntimeConfig) -> bool:
        if not self.spec.enabled or not alters_outputs(previous, config):
            return True
        if isinstance(self._reference(previous), QualityRecord):
            return True  # recorded for an earlier change from the same config
        reference = self._recording(("reference", previous.key()))
        if reference is None:
            return False
        self._references[previous.key()] = reference
        if isinstance(reference, QualityRecord) and self.store_dir is not None:
            self.store_dir.mkdir(parents=True, exist_ok=True)
            self._path(previous).write_text(reference.model_dump_json())
        return True

    def check(self, previous: RuntimeConfig, config: RuntimeConfig, on: str | None = None) -> QualityVerdict | None:
        if not self.spec.enabled or not alters_outputs(previous, config):
            return None
        key = (previous.key(), config.key())
        if key not in self._verdicts:  # a verdict waiting on one more latency window is not measured twice
            verdict = self._judge(previous, key, on)
            if verdict.pending:
                return verdict
            self._verdicts[key] = verdict
            self.checks.append(QualityCheck(previous, config, verdict))
        return self._verdicts[key]

    def _recording(self, key: tuple[str, ...],
                   urls: Callable[[], Sequence[str]] | None = None) -> QualityRecord | str | None:
        """The probe set's answers for `key`, asked of `urls()` (every serving endpoint by default): recorded on the
        first call, then the record (or why there is none) once done; None while the recording runs."""
        future = self._running.get(key)
        if future is None:
            ask = urls or self.urls
            future = self._running[key] = self._submit(lambda: self._probe(ask))
        if not future.done():
            return None
        del self._running[key]
        try:
            return future.result()
        except RecordFailed as error:
            return str(error)

    def _probe(self, urls: Callable[[], Sequence[str]]) -> QualityRecord:
        try:
            return self.recorder(urls(), self.model, self.spec.probe_max_tokens)
        finally:
            self.probed_until_s = max(self.probed_until_s, self._clock())

    def _judge(self, previous: RuntimeConfig, key: tuple[str, str], on: str | None) -> QualityVerdict:
        reference = self._reference(previous)
        if reference is None and on is not None:  # a canary's siblings still run `previous`: record it there
            reference = self._recording(("reference", previous.key()), lambda: self._siblings(on))
            if reference is None:
                return PENDING
            self._references[previous.key()] = reference
        if not isinstance(reference, QualityRecord):
            why = reference or "no reference was recorded before the change (the process restarted)"
            return QualityVerdict(False, f"quality not measured: {why}")
        candidate = self._recording(("candidate", *key), None if on is None else lambda: [on])
        if candidate is None:
            return PENDING
        if not isinstance(candidate, QualityRecord):
            return QualityVerdict(False, f"quality not measured: {candidate}")
        measured = compare(reference, candidate)
        broken = self._broken(measured)
        if broken:
            return QualityVerdict(False, f"quality: {'; '.join(broken)} ({measured.describe()})", measured)
        return QualityVerdict(True, f"quality holds: {measured.describe()}", measured)

    def _siblings(self, canary: str) -> list[str]:
        return [url for url in self.urls() if url.rstrip("/") != canary.rstrip("/")]

    def _broken(self, measured: QualityMeasurement) -> list[str]:
        spec = self.spec
        broken = []
        if measured.token_agreement < spec.min_token_agreement:
            broken.append(f"token agreement {measured.token_agreement:.2f} < minTokenAgreement "
                          f"{spec.min_token_agreement:g}")
        if measured.top1_agreement < spec.min_top1_agreement:
            broken.append(f"top-1 agreement {measured.top1_agreement:.3f} < minTop1Agreement "
                          f"{spec.min_top1_agreement:g}")
        if measured.mean_kl > spec.max_mean_kl:
            broken.append(f"mean KL {measured.mean_kl:.4f} > maxMeanKl {spec.max_mean_kl:g}")
        return broken

    def _reference(self, previous: RuntimeConfig) -> QualityRecord | str | None:
        found = self._references.get(previous.key())
        if found is None and self.store_dir is not None and self._path(previous).exists():
            found = self._references[previous.key()] = QualityRecord.model_validate_json(
                self._path(previous).read_text())
        if isinstance(found, QualityRecord) and (found.max_tokens, found.probe_set_version) != (
                self.spec.probe_max_tokens, PROBE_SET_VERSION):
            return None
        return found

    def _path(self, config: RuntimeConfig) -> Path:
        assert self.store_dir is not None
        return self.store_dir / f"reference-{hashlib.sha256(config.key().encode()).hexdigest()[:16]}.json"
