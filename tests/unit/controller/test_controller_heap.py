"""Full garbage collections scan only young objects: old ones are frozen, and handed back to the collector once in a
while so cycles among them are freed too. At 1,000 TunedModels full collections took 1.5-2 s each, 2-4 a minute,
and stopped the event loop for that long (slotune_operator_gc_pause_seconds in bench/results/operator_scale.json)."""

from __future__ import annotations

import asyncio
import gc

from slotune.controller import heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_old_objects_are_frozen_and_thawed_once_an_interval() -> None:
    now = [0.0]
    freezer = heap.Freezer(unfreeze_s=100.0, monotonic=lambda: now[0])
    old = [_Node() for _ in range(10_000)]
    try:
        freezer.step()
        assert gc.get_freeze_count() >= len(old)  # a full collection no longer scans them
        now[0] = 100.0
        freezer.step()
        assert gc.get_freeze_count() == 0  # every object is the collector's again
        del old[:]  # cycles that were frozen are garbage now, and a full collection frees them
        assert gc.collect() >= 10_000
    finally:
        gc.unfreeze()


def test_the_operator_keeps_freezing_until_cancelled() -> None:
    steps = []

    class _Counting(heap.Freezer):
        def step(self) -> None:
            steps.append(1)

    async def scenario() -> None:
        task = asyncio.create_task(heap.keep_old_objects_frozen(0.001, _Counting()))
        while len(steps) < 3:  # progress: three steps
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(scenario())
    assert len(steps) >= 3
