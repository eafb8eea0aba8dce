"""The suite's cores lock (tests/harness/cores.py): a `cores` test waits for the tests that run and goes before the
tests that start after it asked, so a worker running test after test cannot starve it."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from tests.harness.cores import holding


def gate_taken(directory: Path) -> bool:
    with open(directory / "gate", "a") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False


def test_an_exclusive_holder_waits_for_readers_and_goes_before_later_ones(tmp_path: Path) -> None:
    order: list[str] = []
    release_first = threading.Event()

    def hold(name: str, exclusive: bool, until: threading.Event | None = None) -> None:
        with holding(tmp_path, exclusive):
            order.append(name)
            if until is not None:
                until.wait(timeout=60)

    first = threading.Thread(target=hold, args=("first reader", False, release_first))
    first.start()
    while not order:
        first.join(timeout=0.01)
    writer = threading.Thread(target=hold, args=("writer", True))
    writer.start()
    while not gate_taken(tmp_path):  # the writer holds the gate while it waits for the reader
        writer.join(timeout=0.01)
    later = threading.Thread(target=hold, args=("later reader", False))
    later.start()
    later.join(timeout=0.5)  # time for a later reader to jump the queue, were it let
    assert order == ["first reader"]
    release_first.set()
    for thread in (first, writer, later):
        thread.join(timeout=60)
    assert order == ["first reader", "writer", "later reader"]


def test_readers_share(tmp_path: Path) -> None:
    with holding(tmp_path, exclusive=False), holding(tmp_path, exclusive=False):
        assert not gate_taken(tmp_path)
