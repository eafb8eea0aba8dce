"""The cyclic garbage collector on a heap of a thousand TunedModels: full collections that scan only what is new.

A full collection walks every tracked object while holding the GIL, so it stops the event loop, the tick workers and
the watches at once. At 1,000 TunedModels (a ~480 MiB heap) the operator ran 2-4 of them a minute, 1.5-2 s each on
the loaded 2-core machine (`slotune_operator_gc_pause_seconds`): the event loop's 2-3 s stalls that delayed deletes
and creates. Objects that have lived `freeze_s` are moved to the collector's permanent generation (`gc.freeze`), so a
full collection scans only younger ones; almost all of the old ones (TuningRuns, kopf's per-object memory, caches)
live as long as their TunedModel. Reference counting still frees everything that is not in a cycle; a cycle among
frozen objects (a deleted TunedModel's run) waits for `unfreeze_s`, when everything is handed back to the collector
and one full collection scans the whole heap again.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

FREEZE_S = 60.0  # objects older than about this are not scanned by full collections
UNFREEZE_S = 3600.0  # how often every object is scanned again (frozen cycles freed)


class Freezer:
    def __init__(self, unfreeze_s: float = UNFREEZE_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.unfreeze_s = unfreeze_s
        self._monotonic = monotonic
        self._thawed_at = monotonic()

    def step(self) -> None:
        """Freeze what is tracked now; once every `unfreeze_s`, thaw everything instead (the next full collection
        then scans the whole heap and frees cycles among old objects)."""
        if self._monotonic() - self._thawed_at >= self.unfreeze_s:
            gc.unfreeze()
            self._thawed_at = self._monotonic()
            return
        gc.freeze()


async def keep_old_objects_frozen(freeze_s: float = FREEZE_S, freezer: Freezer | None = None) -> None:
    """On the event loop, until cancelled: `Freezer.step` every `freeze_s`."""
    freezer = freezer or Freezer()
    while True:
        await asyncio.sleep(freeze_s)
        freezer.step()
