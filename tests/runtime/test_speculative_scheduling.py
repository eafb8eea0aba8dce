"""Scheduling drafts (pure Python, real BlockManager, fake verification): drafts ride along with a decode, the token
budget cuts them, and after verification the sequence's computed tokens and blocks roll back to the accepted ones."""

from __future__ import annotations

from gpu_runtime.config import SamplingParams, SchedulerKnobs
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.scheduler import Scheduler
from gpu_runtime.engine.sequence import Sequence

BS = 4


def _decoding(s: Scheduler, num_prompts: list[int]) -> list[Sequence]:
    """Sequences whose prompts are computed and that have their first output token (all but the last token in KV)."""
    seqs = [Sequence(f"s{i}", list(range(100 * i, 100 * i + n)), SamplingParams(max_tokens=50), 0.0)
            for i, n in enumerate(num_prompts)]
    for seq in seqs:
        s.add(seq)
    s.on_step_done(s.schedule())
    for seq in seqs:
        seq.token_ids.append(1)
    return seqs


def test_drafts_are_scheduled_after_the_decode_token_and_cut_by_the_budget() -> None:
    s = Scheduler(SchedulerKnobs(), BlockManager(64, BS))
    a, b = _decoding(s, [6, 6])
    s.set_knobs(SchedulerKnobs(max_num_batched_tokens=16))
    a.spec_token_ids, b.spec_token_ids = [9] * 12, [8] * 12
    out = s.schedule()
    assert [(i.num_new_tokens, i.num_spec_tokens, i.completes) for i in out.scheduled] == [(13, 12, True),
                                                                                            (3, 2, True)]


def test_verification_rolls_back_rejected_drafts_and_their_blocks() -> None:
    bm = BlockManager(64, BS)
    s = Scheduler(SchedulerKnobs(), bm)
    (seq,) = _decoding(s, [7])  # 8 tokens, 7 computed: two blocks
    seq.spec_token_ids = [5, 6, 7, 8, 9, 10]
    out = s.schedule()
    assert len(bm.block_ids("s0")) == 4  # room for 8 + 6 drafts = 14 positions
    seq.token_ids += [5, 42]  # the engine appends one accepted draft and the target's correction
    s.on_step_done(out)
    assert seq.num_computed_tokens == 9  # 8 old tokens + the accepted draft; the correction has no KV yet
    assert len(bm.block_ids("s0")) == 3  # blocks holding only rejected drafts went back
    assert bm.num_free_blocks == 61


def test_lookahead_slots_come_from_the_scheduler() -> None:
    """A draft model drafts after scheduling: the scheduler reserves its slots (blocks included) up front."""
    bm = BlockManager(64, BS)
    s = Scheduler(SchedulerKnobs(), bm)
    _decoding(s, [7])  # 8 tokens, 7 computed
    out = s.schedule(lambda _: 5)
    [item] = out.scheduled
    assert (item.num_new_tokens, item.num_spec_tokens) == (6, 5)
    assert len(bm.block_ids("s0")) == bm.blocks_needed(8 + 5)  # the draft writes into blocks it never allocated


def test_drafts_never_preempt_another_sequence() -> None:
    bm = BlockManager(6, BS)
    s = Scheduler(SchedulerKnobs(), bm)
    a, _ = _decoding(s, [7, 7])  # 8 tokens each: two blocks each, two blocks free
    a.spec_token_ids = [9] * 12  # would need three more blocks
    out = s.schedule()
    assert out.preempted == () and [i.num_spec_tokens for i in out.scheduled] == [0, 0]
    assert {i.seq.request_id for i in out.scheduled} == {"s0", "s1"}


def test_the_speculative_package_owns_no_kv_blocks() -> None:
    """Only the scheduler allocates or frees blocks; speculation reads the tables it is handed."""
    import ast
    from pathlib import Path

    import gpu_runtime.speculative as speculative

    for path in Path(speculative.__file__).parent.glob("*.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom)}
        assert "gpu_runtime.engine.block_manager" not in imported, path.name
