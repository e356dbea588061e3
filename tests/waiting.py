"""Waiting for an event in a test: a real worker's row, a log line, a port."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for[T](
    predicate: Callable[[], T], what: str = "it", timeout: float = 90.0, every: float = 0.05
) -> T:
    """Ask `predicate()` every `every` seconds until it is true, and return its value. The
    timeout is a safety net only, never a measurement: each wait ends at its event, however
    slow the machine."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(every)
    return value
