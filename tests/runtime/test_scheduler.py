"""Scheduler unit tests with a real BlockManager and fake model outputs (no torch)."""

from __future__ import annotations

import subprocess
import sys

from gpu_runtime.config import SamplingParams, SchedulerKnobs
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.scheduler import Scheduler, SchedulerOutput
from gpu_runtime.engine.sequence import Sequence, SequenceStatus

BS = 4


def _seq(name: str, num_prompt: int, first: int | None = None) -> Sequence:
    """Distinct names get distinct tokens (no accidental prefix hits) unless `first` says otherwise."""
    start = sum(map(ord, name)) * 1000 if first is None else first
    return Sequence(name, list(range(start, start + num_prompt)), SamplingParams(max_tokens=100), 0.0)


def _scheduler(num_blocks: int = 64, **knobs: object) -> Scheduler:
    k = SchedulerKnobs(**knobs)  # type: ignore[arg-type]
    return Scheduler(k, BlockManager(num_blocks, BS, k.enable_prefix_caching))


def _step(s: Scheduler) -> SchedulerOutput:
    """Schedule, 'run the model', append a fake token to every sequence that completed its tokens."""
    out = s.schedule()
    completed = [item.seq for item in out.scheduled if item.completes]
    s.on_step_done(out)
    for seq in completed:
        seq.token_ids.append(7)
    return out


def test_running_first_then_fcfs_within_token_budget() -> None:
    s = _scheduler(max_num_batched_tokens=20)  # the smallest budget the knob schema allows is 16
    a, b, c = _seq("a", 12), _seq("b", 6), _seq("c", 10)
    for q in (a, b, c):
        s.add(q)
    out = _step(s)
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 12), ("b", 6), ("c", 2)]
    out = _step(s)  # a and b decode first, then c's remaining prefill chunk
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 1), ("b", 1), ("c", 8)]
    assert c.num_output_tokens == 1  # c's last prompt token was computed, so it got its first token


def test_no_chunking_waits_for_a_budget_that_fits_the_whole_prompt() -> None:
    s = _scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    a, b = _seq("a", 10), _seq("b", 10)
    s.add(a)
    s.add(b)
    assert [i.seq.request_id for i in _step(s).scheduled] == ["a"]
    assert [(i.seq.request_id, i.num_new_tokens) for i in _step(s).scheduled] == [("a", 1), ("b", 10)]


def test_prompt_longer_than_budget_runs_alone_without_chunking() -> None:
    s = _scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    s.add(_seq("long", 20))
    assert [i.num_new_tokens for i in _step(s).scheduled] == [20]


def test_max_num_seqs_limits_admission() -> None:
    s = _scheduler(max_num_seqs=2)
    for i in range(3):
        s.add(_seq(f"s{i}", 2))
    _step(s)
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    s = _scheduler(num_blocks=4)
    a, b = _seq("a", 8), _seq("b", 7)
    s.add(a)
    s.add(b)
    _step(s)  # a: 2 blocks, b: 2 blocks, pool full
    out = _step(s)  # a needs a third block for its 9th token: b (admitted last) is preempted
    assert [v.request_id for v in out.preempted] == ["b"]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and s.waiting[0] is b
    assert s.num_preemptions == 1 and len(b.token_ids) == 8  # its generated token is kept for recompute
    assert [i.seq.request_id for i in out.scheduled] == ["a"]


def test_sequence_preempts_itself_when_alone_and_out_of_blocks() -> None:
    s = _scheduler(num_blocks=2)
    a = _seq("a", 8)
    s.add(a)
    _step(s)
    out = _step(s)
    assert out.scheduled == () and [v.request_id for v in out.preempted] == ["a"]


def test_prefix_cache_hit_skips_computed_tokens() -> None:
    s = _scheduler()
    first = _seq("first", 10, first=0)
    s.add(first)
    _step(s)
    s.remove(first)
    second = _seq("second", 10, first=0)
    s.add(second)
    out = _step(s)
    assert (out.scheduled[0].start, out.scheduled[0].num_new_tokens) == (8, 2)
    assert second.num_cached_tokens == 8
    assert s.block_manager.prefix_cache_hits_tokens == 8


def test_set_knobs_changes_the_next_schedule() -> None:
    s = _scheduler(max_num_batched_tokens=100)
    for i in range(4):
        s.add(_seq(f"s{i}", 10, first=i * 100))
    s.set_knobs(SchedulerKnobs(max_num_batched_tokens=25, enable_prefix_caching=False))
    out = _step(s)
    assert out.num_batched_tokens == 25
    assert not s.block_manager.enable_prefix_caching


def test_remove_frees_blocks() -> None:
    s = _scheduler(num_blocks=8)
    a = _seq("a", 9)
    s.add(a)
    _step(s)
    s.remove(a)
    assert s.block_manager.num_free_blocks == 8 and not s.has_unfinished()


def test_scheduler_and_block_manager_do_not_import_torch() -> None:
    code = ("import sys, gpu_runtime.engine.scheduler, gpu_runtime.engine.block_manager; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0
