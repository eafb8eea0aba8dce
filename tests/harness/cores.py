"""The cores to itself: a test marked `cores` runs while no other test of the run does, on any xdist worker.

Every test holds a shared lock on one file for its whole protocol (setup, call, teardown); a `cores` test holds it
exclusive. A `cores` test asserts decisions measured in milliseconds against a target it calibrated on this machine
at its start, with a stated tolerance for the machine slowing down afterwards (the workload-shift e2e: x2.5). What
it cannot control, other work on the box, it tolerates up to that bound; what it can, the rest of its own suite, it
removes: the other worker running the SmolLM2 runtime and local-mode tunes slowed the box x3-5 after calibration
and failed the workload-shift e2e in 3 of 4 clean-clone CI runs.

flock gives a waiting writer no preference over new readers, so a gate comes first: a reader holds the gate only
while it takes its shared lock; the writer holds it until it is done, so a worker that finishes one test and starts
the next queues behind the writer instead of starving it.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def holding(directory: Path, exclusive: bool) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "gate", "a") as gate, open(directory / "cores", "a") as cores:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(cores, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cores, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
