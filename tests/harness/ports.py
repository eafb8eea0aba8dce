"""Loopback ports for test servers."""

from __future__ import annotations

import socket
import time

from slotune.backends.processes import free_port

__all__ = ["free_port", "wait_for_port"]


def wait_for_port(port: int, timeout_s: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s")
